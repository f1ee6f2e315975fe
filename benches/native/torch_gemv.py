#!/usr/bin/env python3
"""Native side-by-side for `inkling-wgpu bench kernels --json`: the same GEMV shapes through PyTorch on CUDA.

- bf16 GEMV through cuBLAS (`torch.mv`-shaped `x @ W.T` with one token), and
- int4 weight-only GEMV through `torch._weight_int4pack_mm` (group size 64 and 128), where the GPU supports it.

Effective GB/s counts the weight (and scale) bytes read once per call, like the Rust bench. A rotation of
weight copies whose total exceeds the L2 several times keeps the cache from flattering the numbers.
Timing: CUDA events around `iters` back-to-back calls after warm-up. Output: the JSON schema of
`inkling-wgpu bench kernels --json` on stdout.

Usage: python3 benches/native/torch_gemv.py [--peak-gbs 4250] [--iters 200] > torch.json
"""
import argparse
import json
import sys

import torch

SHAPES = [
    ("inkling gate_up [6144x6144]", 6144, 6144, 1),
    ("inkling down [6144x3072]", 6144, 3072, 1),
    ("inkling-small gate_up [4096x4096]", 4096, 4096, 1),
    ("inkling-small down [4096x2048]", 4096, 2048, 1),
    ("inkling-small k_proj [1024x4096]", 1024, 4096, 1),
    ("inkling-small router [256x4096]", 256, 4096, 1),
    ("inkling-small shared gate_up 2x[4096x4096]", 4096, 4096, 2),
    ("inkling moe-layer gate_up 8x[6144x6144]", 6144, 6144, 8),
    ("inkling moe-layer down 8x[6144x3072]", 6144, 3072, 8),
    ("inkling-small routed gate_up 6x[4096x4096]", 4096, 4096, 6),
    ("inkling-small routed down 6x[4096x2048]", 4096, 2048, 6),
    ("inkling-small moe-layer gate_up 8x[4096x4096]", 4096, 4096, 8),
    ("inkling-small moe-layer down 8x[4096x2048]", 4096, 2048, 8),
]


def rotation(bytes_per_set, min_total=2 << 30):
    return max(2, -(-min_total // bytes_per_set))


def time_calls(fn, sets, iters):
    for i in range(10):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(sets[i % len(sets)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # microseconds per call


def bench_bf16(o, i, experts, iters):
    nbytes = experts * o * i * 2
    n = rotation(nbytes)
    sets = [[torch.randn(o, i, device="cuda", dtype=torch.bfloat16) for _ in range(experts)] for _ in range(n)]
    x = torch.randn(1, i, device="cuda", dtype=torch.bfloat16)

    def fn(ws):
        for w in ws:
            torch.nn.functional.linear(x, w)

    return nbytes, time_calls(fn, sets, iters)


def bench_int4(o, i, experts, gs, iters):
    # w: [o, i] int4 packed for tinygemm; scales_and_zeros: [i/gs, o, 2] bf16.
    nbytes = experts * (o * i // 2 + (i // gs) * o * 2 * 2)
    n = rotation(nbytes)
    sets = []
    for _ in range(n):
        ws = []
        for _ in range(experts):
            q = torch.randint(0, 16, (o, i), dtype=torch.int32, device="cuda")
            qu8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            packed = torch._convert_weight_to_int4pack(qu8, 8)
            sz = torch.rand(i // gs, o, 2, device="cuda", dtype=torch.bfloat16)
            ws.append((packed, sz))
        sets.append(ws)
    x = torch.randn(1, i, device="cuda", dtype=torch.bfloat16)

    def fn(ws):
        for packed, sz in ws:
            torch._weight_int4pack_mm(x, packed, gs, sz)

    return nbytes, time_calls(fn, sets, iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peak-gbs", type=float, default=None)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    results = []
    for shape, o, i, experts in SHAPES:
        rows = [("bf16", lambda: bench_bf16(o, i, experts, a.iters))]
        for gs in (64, 128):
            rows.append((f"int4-g{gs}", lambda gs=gs: bench_int4(o, i, experts, gs, a.iters)))
        for fmt, run in rows:
            try:
                nbytes, us = run()
            except Exception as e:  # e.g. int4pack unsupported on this GPU
                print(f"# {fmt} {shape}: {e}", file=sys.stderr)
                continue
            gbs = nbytes / (us * 1e-6) / 1e9
            results.append({
                "format": fmt, "shape": shape, "experts": experts, "bytes": nbytes,
                "us_per_dispatch": us, "gbs": gbs,
                "frac_peak": (gbs / a.peak_gbs) if a.peak_gbs else None,
            })
            torch.cuda.empty_cache()
    print(json.dumps({
        "adapter": torch.cuda.get_device_name(0), "backend": f"torch {torch.__version__} CUDA {torch.version.cuda}",
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
