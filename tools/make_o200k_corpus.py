#!/usr/bin/env python3
"""Reference ids of the o200k tokenizer on a varied corpus, from Python `tokenizers` (its Rust core
built with the Oniguruma regex backend), for tests/suite/model/tokenizer_o200k.rs, which checks that the
crate's pure-Rust regex backend (fancy-regex) encodes every text to the same ids.

Usage: pip install tokenizers; python3 tools/make_o200k_corpus.py
Writes tests/fixtures/tokenizer-o200k/corpus.json: [{"text": ..., "ids": [...]}, ...].
The texts: slices of this repository's documents and sources (as they were when it ran), and
seeded random strings mixing scripts, digits, whitespace runs, contractions and punctuation.
"""
import gzip
import json
import os
import random

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests/fixtures/tokenizer-o200k")

tok = Tokenizer.from_str(gzip.open(os.path.join(FIX, "tokenizer.json.gz")).read().decode())

texts = []
for rel in ["README.md", "FORMATS.md", "wgsl/gemv.wgsl", "src/model/sampling.rs", "tools/make_tiny_inkling.py"]:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        body = f.read()
    for k in range(0, min(len(body), 12000), 3000):
        texts.append(body[k : k + 3000])

rng = random.Random(20240515)
pieces = [
    "I'm", "you're", "DON'T", "he'd", "we'll", "it's", "'S", "'ll", "o'clock", "rock'n'roll",
    "3.14", "1,000", "0x1F", "42", "007", "1e-9", "١٢٣", "४२", "²³",
    " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u200b",
    "...", "!!", "?!", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\",
    "naïve", "Größe", "Øre", "İstanbul", "ǅ", "ﬁ", "Ⅻ",
    "日本", "語", "中文", "한국", "ไทย", "עברית", "العربية", "हिन्दी", "Ελλάδα", "Москва", "ქართული",
    "😀", "👍🏿", "🇯🇵", "👨\u200d👩\u200d👧", "❤\ufe0f", "\u0301", "e\u0301",
    "CamelCase", "snake_case", "kebab-case", "UPPER", "lower", "MiXeD", "x86_64", "v1.2.3",
]
for _ in range(48):
    n = rng.randint(5, 60)
    texts.append("".join(rng.choice(pieces) + (" " if rng.random() < 0.4 else "") for _ in range(n)))
for _ in range(16):
    n = rng.randint(20, 200)
    cps = []
    while len(cps) < n:
        c = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x24F), rng.randint(0x370, 0x52F),
                        rng.randint(0x4E00, 0x9FFF), rng.randint(0x1F300, 0x1FAFF), rng.randint(0x600, 0x6FF)])
        if not 0xD800 <= c <= 0xDFFF:
            cps.append(chr(c))
    texts.append("".join(cps))

out = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
with open(os.path.join(FIX, "corpus.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    f.write("\n")
print(len(out), "texts,", sum(len(c["ids"]) for c in out), "ids")
