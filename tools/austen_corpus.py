#!/usr/bin/env python3
"""The Jane Austen corpus of the demo model: extraction, split and checksums.

Source: Debian's `r-cran-janeaustenr` 1.0.0-1 (MIT-licensed R package, debian/copyright; the six
novels are public domain, Austen d. 1817, Project Gutenberg boilerplate already stripped). Only the
standard library is needed, no R:

    apt-get download r-cran-janeaustenr          # r-cran-janeaustenr_1.0.0-1_all.deb, 1,626,392 B
    python3 tools/austen_corpus.py --deb r-cran-janeaustenr_1.0.0-1_all.deb --out DIR

`--deb` may also be a directory where the .deb was already extracted with `dpkg-deb -x`.

What it reads: `usr/lib/R/site-library/janeaustenr/data/Rdata.rdb` holds one record per novel,
each `[4-byte big-endian decompressed length][zlib stream]` of an R XDR serialisation (format 2 or
3) of a character vector (STRSXP, type 16) of CHARSXPs (type 9): one string per line of the
Gutenberg text, hard-wrapped at about 70 columns, paragraphs separated by empty lines.

What it writes (UTF-8, "\\n" line ends):
- A *paragraph* is a run of non-empty lines, each stripped, joined with one space.
- A *chapter* starts at a heading line (`CHAPTER …`/`Chapter …`, `VOLUME …`/`Volume …` is kept as
  a paragraph of the chapter it precedes) and runs to the next heading; the title page before the
  first heading is a chapter of its own. Chapter text = its paragraphs joined with "\\n\\n".
- The split (fixed, by chapter; never changes with a seed):
  * `test.txt`: Persuasion, chapters 21–24 (the last four chapters of the last novel written);
    held out for evaluation (perplexity, quantisation quality). Never trained on.
  * `valid.txt`: Northanger Abbey, chapters 30–31 (its last two); held out for monitoring the
    training loss (checkpoint choice). Never trained on.
  * `train.txt`: every other chapter of the six novels.
  In each file the chapters are joined with "\\n\\n". `train_docs.txt` is `train.txt` with every
  chapter followed by the literal `<|endoftext|>` instead (the training documents; the tokenizer
  maps that literal to its special token).
- It checks each file's sha256 against `SHA256` below and exits non-zero on any difference.
"""

import argparse
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

RDB = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
# Order of the records in Rdata.rdb, and each novel's first line.
NOVELS = [
    ("emma", "EMMA"),
    ("mansfield_park", "MANSFIELD PARK"),
    ("northanger_abbey", "NORTHANGER ABBEY"),
    ("persuasion", "Persuasion"),
    ("pride_and_prejudice", "PRIDE AND PREJUDICE"),
    ("sense_and_sensibility", "SENSE AND SENSIBILITY"),
]
TEST = ("persuasion", range(21, 25))
VALID = ("northanger_abbey", range(30, 32))
EOT = "<|endoftext|>"

SHA256 = {
    "train.txt": "e4e988149af303958c186b004a65eb8ffdcea395983e2ab591257f8edc4ac13a",
    "valid.txt": "274e1c9c535e1382762c204a31b6268aeb6710c30fd61ce500cba09296585c53",
    "test.txt": "ec74a03b601e663b7983d10ba82d5181547f88c2e966de149c47930af824c930",
    "train_docs.txt": "8832825708925a898c37f33061c283f98bc1de02b6b7098af11af7feb4671e5d",
}

HEADING = re.compile(r"^(CHAPTER|Chapter)\s+([0-9]+|[IVXLC]+)\.?$")
VOLUME = re.compile(r"^(VOLUME|Volume)\s+([0-9]+|[IVXLC]+)\.?$")


def roman(s: str) -> int:
    if s.isdigit():
        return int(s)
    vals = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}
    n = 0
    for a, b in zip(s, s[1:] + " "):
        v = vals[a]
        n += -v if b != " " and vals[b] > v else v
    return n


def read_records(rdb: bytes) -> list[list[str]]:
    """Every record of an R lazy-load database holding character vectors: a list of lines."""
    out = []
    off = 0
    while off < len(rdb):
        (n,) = struct.unpack(">I", rdb[off : off + 4])
        z = zlib.decompressobj()
        data = z.decompress(rdb[off + 4 :])
        if len(data) != n:
            raise SystemExit(f"{RDB}: record at byte {off}: {len(data)} bytes, header says {n}")
        off = len(rdb) - len(z.unused_data)
        if data[:2] != b"X\n":
            raise SystemExit(f"{RDB}: record {len(out)} is not an XDR serialisation")
        p = 2
        (version,) = struct.unpack(">i", data[p : p + 4])
        p += 12  # format version, R version, minimal R version
        if version == 3:
            (k,) = struct.unpack(">i", data[p : p + 4])
            p += 4 + k  # native encoding name
        flags, count = struct.unpack(">ii", data[p : p + 8])
        p += 8
        if flags & 0xFF != 16:
            raise SystemExit(f"{RDB}: record {len(out)} is type {flags & 0xFF}, not a character vector")
        lines = []
        for i in range(count):
            flags, k = struct.unpack(">ii", data[p : p + 8])
            p += 8
            if flags & 0xFF != 9 or k < 0:
                raise SystemExit(f"{RDB}: record {len(out)} string {i}: not a CHARSXP (or NA)")
            lines.append(data[p : p + k].decode("utf-8"))
            p += k
        out.append(lines)
    return out


def chapters(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(chapter number, paragraphs) in order; number 0 is the title page. A chapter numbering that
    restarts (Persuasion's two volumes use 1–24 throughout, others restart per volume) continues."""
    paras, cur = [], []
    for line in lines + [""]:
        s = line.strip()
        if s:
            cur.append(s)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    out = [(0, [])]
    pending_volume = []
    for p in paras:
        if VOLUME.match(p):
            pending_volume.append(p)
            continue
        if HEADING.match(p):
            out.append((len(out), pending_volume + [p]))
            pending_volume = []
            continue
        out[-1][1].extend(pending_volume + [p])
        pending_volume = []
    return out


def build(rdb: bytes) -> dict[str, str]:
    recs = read_records(rdb)
    if len(recs) != len(NOVELS):
        raise SystemExit(f"{RDB}: {len(recs)} records, expected {len(NOVELS)}")
    train, valid, test = [], [], []
    for (name, first), lines in zip(NOVELS, recs):
        if lines[0] != first:
            raise SystemExit(f"{RDB}: a record starts with {lines[0]!r}, expected {first!r}")
        for num, paras in chapters(lines):
            if not paras:
                continue
            text = "\n\n".join(paras)
            if (name, num) in {(TEST[0], c) for c in TEST[1]}:
                test.append(text)
            elif (name, num) in {(VALID[0], c) for c in VALID[1]}:
                valid.append(text)
            else:
                train.append(text)
    if len(test) != len(TEST[1]) or len(valid) != len(VALID[1]):
        raise SystemExit(f"split: {len(test)} test and {len(valid)} validation chapters found")
    return {
        "train.txt": "\n\n".join(train) + "\n",
        "valid.txt": "\n\n".join(valid) + "\n",
        "test.txt": "\n\n".join(test) + "\n",
        "train_docs.txt": "".join(t + EOT for t in train),
    }


def load_rdb(deb: str) -> bytes:
    if os.path.isdir(deb):
        return open(os.path.join(deb, RDB), "rb").read()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
        return open(os.path.join(tmp, RDB), "rb").read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deb", required=True, help="r-cran-janeaustenr_1.0.0-1_all.deb or its extracted tree")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--print-sha", action="store_true", help="print the checksums instead of checking them")
    args = ap.parse_args()
    files = build(load_rdb(args.deb))
    os.makedirs(args.out, exist_ok=True)
    bad = []
    for name, text in files.items():
        raw = text.encode("utf-8")
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(raw)
        h = hashlib.sha256(raw).hexdigest()
        print(f"{name}: {len(raw)} bytes, {len(text.split())} words, sha256 {h}")
        if not args.print_sha and h != SHA256[name]:
            bad.append(f"{name}: sha256 {h}, expected {SHA256[name]}")
    if bad:
        sys.exit("checksum mismatch:\n  " + "\n  ".join(bad))


if __name__ == "__main__":
    main()
