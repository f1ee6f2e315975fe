#!/usr/bin/env python3
"""The quantisation quality table (BENCHMARKS.md#quantisation-quality): perplexity, mean KL divergence to the full-precision
model and top-1 agreement with it, per weight format and scale rule, on a held-out text.

Only the standard library; it drives the release binary:

    cargo build --release
    python3 tools/quality_table.py --model DIR --text HELD_OUT.txt [--ctx N] [--stride N] \
        [--max-tokens N] [--device cpu] [--json out.json]

For every format in f32, bf16, int4, int4-g32, int4-g64, int4-g128, int3-g64 and every scale rule
(absmax, mse; one row for f32/bf16, which have no scales) it runs

    inkling-wgpu convert --model DIR --out TMP --experts FMT --shared keep --dense keep --scales RULE
    inkling-wgpu perplexity --model TMP --file TEXT --kl-base DIR --json ...

("experts" rows), then the same with --shared FMT --dense FMT ("experts + dense" rows: attention
projections, dense MLPs and shared experts in FMT too; embeddings, norms, router and the output head
keep the source precision). The weight error column is convert's relative Frobenius error
sqrt(sum |W - deq(W)|^2 / sum |W|^2) over the routed experts (and over the dense class where quantised).
The markdown table goes to stdout.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

FORMATS = ["f32", "bf16", "int4", "int4-g32", "int4-g64", "int4-g128", "int3-g64"]
RULES = ["absmax", "mse"]
LINE = re.compile(r"^(.+?): (\S+)(?: with (\w+) scales)?, (\d+) matrices, relative weight error ([0-9.eE+-]+)")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return p


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="full-precision checkpoint (the KL base)")
    ap.add_argument("--text", required=True, help="held-out UTF-8 text")
    ap.add_argument("--bin", default=os.path.join(root, "target", "release", "inkling-wgpu"))
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--stride", type=int)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write every measurement here")
    a = ap.parse_args()

    extra = ["--device", a.device]
    for k in ["ctx", "stride", "max_tokens"]:
        v = getattr(a, k)
        if v is not None:
            extra += ["--" + k.replace("_", "-"), str(v)]

    rows = []
    with tempfile.TemporaryDirectory(prefix="inkling-quality-") as tmp:
        for scope in ["experts", "experts + dense"]:
            for fmt in FORMATS:
                for rule in RULES:
                    if fmt in ("f32", "bf16") and rule == "mse":
                        continue
                    out = os.path.join(tmp, "%s-%s-%s" % (scope.replace(" + ", "-"), fmt, rule))
                    rest = fmt if scope != "experts" else "keep"
                    conv = run([a.bin, "convert", "--model", a.model, "--out", out, "--experts", fmt,
                                "--shared", rest, "--dense", rest, "--scales", rule])
                    errs = {}
                    for line in conv.stderr.splitlines():
                        m = LINE.match(line.strip())
                        if m:
                            errs[m.group(1)] = float(m.group(5))
                    ppl = run([a.bin, "perplexity", "--model", out, "--file", a.text, "--kl-base", a.model,
                               "--json"] + extra)
                    v = json.loads(ppl.stdout)
                    row = {
                        "scope": scope,
                        "format": fmt,
                        "scales": rule if fmt not in ("f32", "bf16") else "-",
                        "weight_error": errs,
                        "perplexity": v["perplexity"],
                        "bits_per_byte": v["bits_per_byte"],
                        "mean_kl": v["kl_base"]["mean_kl"],
                        "mean_kl_stderr": v["kl_base"]["mean_kl_stderr"],
                        "top1_agreement": v["kl_base"]["top1_agreement"],
                        "base_perplexity": v["kl_base"]["base_perplexity"],
                        "tokens_scored": v["tokens_scored"],
                        "ctx": v["ctx"],
                        "stride": v["stride"],
                    }
                    rows.append(row)
                    print("%-16s %-9s %-6s ppl %.4f kl %.6f top1 %.4f %s" % (
                        scope, fmt, rule, row["perplexity"], row["mean_kl"], row["top1_agreement"], errs),
                        file=sys.stderr)
                    subprocess.run(["rm", "-rf", out])

    base = rows[0]["base_perplexity"]
    print("Base (source precision): perplexity %.4f, %d tokens scored, ctx %d, stride %d, %s.\n" % (
        base, rows[0]["tokens_scored"], rows[0]["ctx"], rows[0]["stride"], a.device))
    print("| quantised | format | scales | weight error experts | weight error dense | perplexity | "
          "Δ ppl | mean KL (nats) | top-1 agreement |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        we = r["weight_error"]
        dense = we.get("dense")
        print("| %s | %s | %s | %s | %s | %.4f | %+.2f %% | %.5f ± %.5f | %.2f %% |" % (
            r["scope"], r["format"], r["scales"],
            "%.4f" % we["routed experts"] if "routed experts" in we else "-",
            "%.4f" % dense if dense is not None and r["scope"] != "experts" else "-",
            r["perplexity"], 100.0 * (r["perplexity"] / base - 1.0),
            r["mean_kl"], r["mean_kl_stderr"], 100.0 * r["top1_agreement"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "text": a.text, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
