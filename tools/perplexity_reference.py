#!/usr/bin/env python3
"""Reference perplexity from transformers 5.24.0 for `inkling-wgpu perplexity` tests.

Windows follow the strided sliding-window method of the transformers guide "Perplexity of
fixed-length models": window k feeds tokens [k*stride, min(k*stride + ctx, n)) to a fresh model
(no cache carried over) and scores only the tokens the previous window did not score; token 0 is
never scored. Per scored token, nll = logsumexp(z) - z[target] in float64 from the float32 logits
of eager-attention InklingForCausalLM (truncated to unpadded_vocab_size by transformers).

    python tools/perplexity_reference.py --model tests/fixtures/tiny-causal-f32 \
        --file tests/fixtures/perplexity-text.txt --case 64:24:bos --case 32:32:nobos \
        --out tests/fixtures/tiny-causal-f32/perplexity.json

Each --case is CTX:STRIDE:bos|nobos[:MAX_TOKENS]; `bos` prepends config.bos_token_id as the CLI
does by default; MAX_TOKENS keeps the text's first tokens only (the CLI's --max-tokens). The text is
encoded with the directory's tokenizer.json without special tokens. A converted container (shard
metadata `inkling.fmt`) is decoded as FORMATS.md says by tools/make_demo_model.py's
`load_dequantised`, so transformers runs the values the engine runs.
"""

import argparse
import hashlib
import json
import math
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer
from safetensors import safe_open
from transformers import InklingForCausalLM


def windows(n, ctx, stride):
    out, prev_end, begin = [], 0, 0
    while n >= 2:
        end = min(begin + ctx, n)
        first = max(prev_end, begin + 1)
        if first < end:
            out.append((begin, end, first))
        prev_end = end
        if end == n:
            break
        begin += stride
    return out


@torch.no_grad()
def score(model, ids, ctx, stride):
    nll_sum, count = 0.0, 0
    for begin, end, first in windows(len(ids), ctx, stride):
        x = torch.tensor([ids[begin:end]])
        logits = model(input_ids=x, use_cache=False).logits[0].double()
        lp = torch.log_softmax(logits, dim=-1)
        for t in range(first, end):
            nll_sum += -lp[t - 1 - begin, ids[t]].item()
            count += 1
    return nll_sum, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--case", action="append", required=True, help="CTX:STRIDE:bos|nobos")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    assert transformers.__version__ == "5.24.0", transformers.__version__
    torch.manual_seed(0)
    with open(a.file, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    enc = tok.encode(text, add_special_tokens=False)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    bos = cfg.get("text_config", cfg).get("bos_token_id")
    single = os.path.join(a.model, "model.safetensors")
    meta = {}
    if os.path.exists(single):
        with safe_open(single, framework="pt") as f:
            meta = f.metadata() or {}
    if "inkling.fmt" in meta:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_demo_model import load_dequantised

        model = load_dequantised(a.model)
    else:
        model = InklingForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
        model.eval()

    cases = []
    for c in a.case:
        parts = c.split(":")
        ctx, stride, b = int(parts[0]), int(parts[1]), parts[2]
        keep = int(parts[3]) if len(parts) > 3 else len(enc.ids)
        ids = list(enc.ids)[:keep]
        # UTF-8 bytes the scored tokens cover (offsets are character offsets in Python)
        end = len(raw) if keep >= len(enc.ids) else len(text[: enc.offsets[keep - 1][1]].encode("utf-8"))
        if b == "bos":
            ids = [bos] + ids
            nbytes = end
        else:
            nbytes = end - len(text[: enc.offsets[0][1]].encode("utf-8"))
        nll_sum, count = score(model, ids, ctx, stride)
        cases.append(
            {
                "ctx": ctx,
                "stride": stride,
                "max_tokens": keep if keep < len(enc.ids) else None,
                "bos": b == "bos",
                "tokens": len(ids),
                "tokens_scored": count,
                "windows": len(windows(len(ids), ctx, stride)),
                "bytes": nbytes,
                "nll_sum": nll_sum,
                "perplexity": math.exp(nll_sum / count),
                "bits_per_byte": nll_sum / (math.log(2) * nbytes),
            }
        )
        print(cases[-1])
    out = {
        "source": "tools/perplexity_reference.py (transformers %s, torch %s, float32, eager)"
        % (transformers.__version__, torch.__version__),
        "text_file": os.path.relpath(a.file, os.path.dirname(os.path.abspath(a.out))),
        "text_sha256": hashlib.sha256(raw).hexdigest(),
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
