#!/usr/bin/env python3
"""Build tests/fixtures/tiny-chat-f32: tiny-causal-f32 whose tokenizer carries Inkling's chat
special tokens (by name, at ids of its own), for the `chat` and `serve` end-to-end tests.

    python tools/make_tiny_chat_fixture.py

Deterministic (numpy seed 12). Needs numpy only. From tests/fixtures/tiny-causal-f32 it:
  - adds the specials below to tokenizer.json as special added tokens at ids 400.. (after its 400
    BPE tokens);
  - fills their rows of `model.embed_tokens.weight` (randn) and `lm_head.weight` (14·randn, the
    fixture's logit spread): the padded vocab (416 rows) already has room for them, so
    `vocab_size` stays 416 and `unpadded_vocab_size` becomes 400 + len(SPECIALS);
  - sets generation_config.json / config.json `eos_token_id` and tokenizer_config.json
    `eos_token` to `<|content_model_end_sampling|>`, Inkling's stop token.
Every other tensor is copied byte for byte.
"""

import json
import os
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "tiny-causal-f32")
DST = os.path.join(ROOT, "tests", "fixtures", "tiny-chat-f32")
SPECIALS = [
    "<|endoftext|>",
    "<|message_user|>",
    "<|message_model|>",
    "<|message_system|>",
    "<|message_tool|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|end_message|>",
    "<|content_model_end_sampling|>",
]
FIRST = 400
SEED = 12


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    body = raw[8 + n :]
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{name}: {info['dtype']}"
        a, b = info["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], dtype="<f4").reshape(info["shape"]).copy()
    return meta, tensors


def write_safetensors(path, meta, tensors):
    header = {}
    if meta is not None:
        header["__metadata__"] = meta
    off = 0
    blobs = []
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name], dtype="<f4")
        b = t.tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    os.makedirs(DST, exist_ok=True)
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    vocab, unpadded = cfg["vocab_size"], cfg["unpadded_vocab_size"]
    assert unpadded == FIRST and FIRST + len(SPECIALS) <= vocab, (unpadded, vocab)
    eos = FIRST + SPECIALS.index("<|content_model_end_sampling|>")

    tok = json.load(open(os.path.join(SRC, "tokenizer.json")))
    assert len(tok["model"]["vocab"]) == FIRST
    for i, s in enumerate(SPECIALS):
        tok["added_tokens"].append(
            {
                "id": FIRST + i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    with open(os.path.join(DST, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=2)

    meta, tensors = read_safetensors(os.path.join(SRC, "model.safetensors"))
    rng = np.random.default_rng(SEED)
    rows = slice(FIRST, FIRST + len(SPECIALS))
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    tensors["model.embed_tokens.weight"][rows] = rng.standard_normal((len(SPECIALS), hidden))
    tensors["lm_head.weight"][rows] = 14.0 * rng.standard_normal((len(SPECIALS), hidden))
    write_safetensors(os.path.join(DST, "model.safetensors"), meta, tensors)

    cfg["unpadded_vocab_size"] = FIRST + len(SPECIALS)
    cfg["eos_token_id"] = eos
    with open(os.path.join(DST, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = json.load(open(os.path.join(SRC, "generation_config.json")))
    gen["eos_token_id"] = [eos]
    gen["max_new_tokens"] = 32
    with open(os.path.join(DST, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    tc = json.load(open(os.path.join(SRC, "tokenizer_config.json")))
    tc["eos_token"] = "<|content_model_end_sampling|>"
    tc["pad_token"] = "<|endoftext|>"
    with open(os.path.join(DST, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert os.path.exists(os.path.join(DST, name))
    print(f"wrote {DST}: specials at {FIRST}..{FIRST + len(SPECIALS) - 1}, eos {eos}")


if __name__ == "__main__":
    main()
