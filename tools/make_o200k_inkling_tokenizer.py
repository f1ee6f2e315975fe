#!/usr/bin/env python3
"""Build tests/fixtures/tokenizer-o200k-inkling/tokenizer.json.gz: o200k_base as a Hugging Face
byte-level BPE tokenizer.json carrying Inkling's special-token table (ids 199998..200057).

Inputs (stdlib only, no network):
  - o200k_base.tiktoken from the `tml-renderers` 0.2.1 wheel (Apache-2.0, Thinking Machines Lab):
        pip download --no-deps tml-renderers==0.2.1
        unzip tml_renderers-0.2.1-*.whl 'tml_renderers/data/o200k_base.tiktoken'
  - tests/fixtures/tokenizer-o200k/tokenizer.json.gz (gpt-oss's o200k, another special table): its
    pre-tokenizer, decoder and post-processor settings are reused as they are.

    python tools/make_o200k_inkling_tokenizer.py --tiktoken tml_renderers/data/o200k_base.tiktoken

Vocab and merges follow transformers' TikTokenConverter (every split of a token into two tokens,
ordered by the merged token's rank, then by the pieces' ranks). The script checks that the result
has the gpt-oss fixture's vocabulary and merges (the same o200k_base below id 199998), and writes a
gzip with a fixed mtime so reruns are byte-identical.
"""

import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT_OSS = os.path.join(ROOT, "tests", "fixtures", "tokenizer-o200k", "tokenizer.json.gz")
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizer-o200k-inkling")
# o200k_base.tiktoken as shipped in tml-renderers 0.2.1 (3,613,922 bytes)
TIKTOKEN_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


# Inkling's special-token table (tml-renderers O200kBaseChatTokenizer.special_tokens(), from 199998).
NAMED = {
    199999: "endoftext",
    200000: "message_user",
    200001: "message_model",
    200002: "message_system",
    200003: "message_tool",
    200004: "content_text",
    200005: "content_image",
    200006: "content_model_end_sampling",
    200008: "content_thinking",
    200010: "end_message",
    200020: "content_audio_input",
    200022: "content_tool_error",
    200023: "audio",
    200024: "content_xml",
    200028: "begin_of_text",
    200043: "audio_end",
    200049: "content_invoke_tool_json",
    200057: "content_invoke_tool_text",
}
FIRST_SPECIAL, END_SPECIAL = 199998, 200058


def bytes_to_unicode():
    """GPT-2's byte → printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def vocab_and_merges(ranks):
    enc = bytes_to_unicode()

    def s(b):
        return "".join(enc[x] for x in b)

    vocab = {}
    merges = []
    for token, rank in ranks.items():
        vocab[s(token)] = rank
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2])
    return vocab, [[s(a), s(b)] for a, b, _ in merges]


def special_tokens():
    out = []
    for i in range(FIRST_SPECIAL, END_SPECIAL):
        name = NAMED.get(i, f"unused_{i}")
        out.append(
            {
                "id": i,
                "content": f"<|{name}|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiktoken", required=True, help="path to o200k_base.tiktoken")
    ap.add_argument("--sha256", default=TIKTOKEN_SHA256, help="expected sha256 of the .tiktoken file")
    args = ap.parse_args()

    raw = open(args.tiktoken, "rb").read()
    digest = hashlib.sha256(raw).hexdigest()
    print(f"{args.tiktoken}: {len(raw)} bytes, sha256 {digest}")
    if args.sha256 and args.sha256 != digest:
        sys.exit(f"sha256 mismatch: expected {args.sha256}")
    ranks = load_ranks(args.tiktoken)
    assert len(ranks) == FIRST_SPECIAL, f"{len(ranks)} ranks, expected {FIRST_SPECIAL}"
    assert sorted(ranks.values()) == list(range(FIRST_SPECIAL)), "ranks are not 0..199997"
    vocab, merges = vocab_and_merges(ranks)

    base = json.loads(gzip.open(GPT_OSS).read())
    if base["model"]["vocab"] != vocab:
        sys.exit("the vocabulary differs from the gpt-oss o200k fixture")
    if base["model"]["merges"] != merges:
        sys.exit("the merges differ from the gpt-oss o200k fixture")
    print(f"vocab {len(vocab)} and merges {len(merges)} equal the gpt-oss o200k fixture's")

    tok = {
        "version": base["version"],
        "truncation": None,
        "padding": None,
        "added_tokens": special_tokens(),
        "normalizer": base["normalizer"],
        "pre_tokenizer": base["pre_tokenizer"],
        "post_processor": base["post_processor"],
        "decoder": base["decoder"],
        "model": dict(base["model"], vocab=vocab, merges=merges),
    }
    data = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode()
    os.makedirs(OUT_DIR, exist_ok=True)
    out = os.path.join(OUT_DIR, "tokenizer.json.gz")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="tokenizer.json", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as g:
        g.write(data)
    with open(out, "wb") as f:
        f.write(buf.getvalue())
    print(f"wrote {out}: {len(data)} bytes of JSON, {len(buf.getvalue())} compressed")


if __name__ == "__main__":
    main()
