#!/usr/bin/env python3
"""Native-Metal side-by-side for `inkling-wgpu bench kernels --json`: the same GEMV shapes through MLX.

- int4-g64 / int3-g64: `mx.quantized_matmul` (bits 4 and 3, group 64, MLX's affine format: packed
  uint32 weights, a scale and a bias per group), `mx.gather_qmm` for the multi-expert rows;
- bf16: `x @ W.T` (`mx.matmul`), `mx.gather_mm` for the multi-expert rows.

One token (x is [1, I], bf16 as MLX models run). Effective GB/s counts the bytes of MLX's own
arrays read once per call (weights + scales + biases), as torch_gemv.py counts PyTorch's. A
rotation of weight copies whose total exceeds 256 MiB keeps caches from flattering, like the Rust
bench. Timing, as MLX users time it: build `iters` back-to-back calls (rotating over the copies),
`mx.eval` them at once, wall clock (`time.perf_counter`) around it; median of 5 after warm-up.

Output on stdout: the JSON schema of `inkling-wgpu bench kernels --json` (rows named exactly as
there, so `inkling-wgpu bench compare` matches them). `--quick` divides the shapes by 4 and uses
one copy (the names then match `bench kernels --quick`); `--div N` divides them by N. `--check` also verifies every call against
a float64 NumPy reference of the dequantized weights: the same call in float32 to 1e-5 and the
timed bf16 call to 5e-2 (bf16 inputs and outputs), relative to the output's norm; it exits 1 on a
mismatch. On Linux, `pip install "mlx[cpu]" numpy` runs it on the CPU (schema and numbers, not
speed); on a Mac, `pip install mlx numpy` runs it on Metal.

Usage: python3 benches/native/mlx_gemv.py [--peak-gbs 400] [--iters 200] [--quick] [--check]
       [--formats int4-g64,bf16] > mlx.json
"""
import argparse
import json
import platform
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

SHAPES = [
    ("inkling gate_up", 6144, 6144, 1),
    ("inkling down", 6144, 3072, 1),
    ("inkling-small gate_up", 4096, 4096, 1),
    ("inkling-small down", 4096, 2048, 1),
    ("inkling-small k_proj", 1024, 4096, 1),
    ("inkling-small router", 256, 4096, 1),
    ("inkling-small shared gate_up", 4096, 4096, 2),
    ("inkling moe-layer gate_up", 6144, 6144, 8),
    ("inkling moe-layer down", 6144, 3072, 8),
    ("inkling-small routed gate_up", 4096, 4096, 6),
    ("inkling-small routed down", 4096, 2048, 6),
    ("inkling-small moe-layer gate_up", 4096, 4096, 8),
    ("inkling-small moe-layer down", 4096, 2048, 8),
]

# engine spelling -> MLX quantization bits (None: bf16)
FORMATS = {"int4-g64": 4, "int3-g64": 3, "bf16": None}
GROUP = 64


def shape_name(label, o, i, experts):
    """The row name `bench kernels` prints."""
    return f"{label} [{o}x{i}]" if experts == 1 else f"{label} {experts}x[{o}x{i}]"


def gather_mm_takes(dtype):
    """Whether `mx.gather_mm` runs on `dtype` on the default device (the CPU's is float32-only)."""
    try:
        a = mx.zeros((1, 1, 8), dtype=dtype)
        mx.eval(mx.gather_mm(a, mx.zeros((2, 8, 8), dtype=dtype),
                             rhs_indices=mx.arange(2, dtype=mx.uint32)))
        return True
    except (RuntimeError, ValueError):
        return False


def make_weights(o, i, experts, bits, dtype, seed):
    """One copy: (arrays read per call, call(x) -> [experts, O])."""
    key = mx.random.key(seed)
    w = (mx.random.normal((experts, o, i), key=key) * 0.02).astype(dtype)
    idx = mx.arange(experts, dtype=mx.uint32)
    if bits is None:
        wt = mx.swapaxes(w, -1, -2)  # [E, I, O] view: x @ W.T
        arrays = [w]
        if experts == 1:
            def call(x):
                return (x @ wt[0]).reshape(1, o)
        elif gather_mm_takes(dtype):
            def call(x):
                return mx.gather_mm(x[None], wt, rhs_indices=idx).reshape(experts, o)
        else:
            # MLX's CPU GatherMM is float32-only: one matmul per expert there
            def call(x):
                return mx.concatenate([x @ wt[e] for e in range(experts)]).reshape(experts, o)
        dense = w
    else:
        wq, s, b = mx.quantize(w, group_size=GROUP, bits=bits)
        arrays = [wq, s, b]
        if experts == 1:
            def call(x):
                y = mx.quantized_matmul(x, wq[0], s[0], b[0], transpose=True,
                                        group_size=GROUP, bits=bits)
                return y.reshape(1, o)
        else:
            def call(x):
                y = mx.gather_qmm(x[None], wq, s, b, rhs_indices=idx, transpose=True,
                                  group_size=GROUP, bits=bits)
                return y.reshape(experts, o)
        dense = mx.dequantize(wq, s, b, group_size=GROUP, bits=bits)
    mx.eval(arrays, dense)
    return arrays, call, dense


def rel_err(got, ref):
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def check(call, dense, x, tol, what):
    """Compare call(x) with float64 NumPy on the dequantized weights; returns the error."""
    got = np.array(call(x).astype(mx.float32), dtype=np.float64)
    w64 = np.array(dense.astype(mx.float32), dtype=np.float64)
    x64 = np.array(x.astype(mx.float32), dtype=np.float64)[0]
    ref = np.einsum("eoi,i->eo", w64, x64)
    err = rel_err(got, ref)
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.3e} > {tol:.0e}")
    return err


def time_calls(calls, x, iters, warm_s):
    """Seconds per call: iters back-to-back calls evaluated at once, median of 5."""
    for c in calls:  # warm-up: every copy once, then about warm_s seconds
        mx.eval(c(x))
    t_warm = time.perf_counter()
    while time.perf_counter() - t_warm < warm_s:
        mx.eval([calls[k % len(calls)](x) for k in range(max(1, iters // 4))])
    secs = []
    for _ in range(5):
        t0 = time.perf_counter()
        mx.eval([calls[k % len(calls)](x) for k in range(iters)])
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peak-gbs", type=float, default=None)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="shapes / 4, one weight copy")
    ap.add_argument("--div", type=int, default=None,
                    help="divide the shapes by this (default 4 with --quick, else 1); one copy")
    ap.add_argument("--warmup", type=float, default=0.3, help="seconds of warm-up per shape")
    ap.add_argument("--check", action="store_true", help="verify every call against NumPy")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="comma-separated: " + ", ".join(FORMATS))
    a = ap.parse_args()
    formats = [f for f in a.formats.split(",") if f]
    for f in formats:
        if f not in FORMATS:
            ap.error(f"--formats: unknown format {f!r}; expected one of {', '.join(FORMATS)}")
    div = a.div or (4 if a.quick else 1)
    if div < 1:
        ap.error("--div: want a positive integer")
    a.quick = a.quick or div > 1
    iters = max(1, a.iters)
    results = []
    for fmt in formats:
        bits = FORMATS[fmt]
        for label, o0, i0, experts in SHAPES:
            o, i = o0 // div, i0 // div
            shape = shape_name(label, o, i, experts)
            arrays, call, dense = make_weights(o, i, experts, bits, mx.bfloat16, 1)
            nbytes = sum(arr.nbytes for arr in arrays)
            copies = 1 if a.quick else min(128, (256 << 20) // nbytes + 1)
            calls = [call] + [make_weights(o, i, experts, bits, mx.bfloat16, 1 + c)[1]
                              for c in range(1, copies)]
            x = (mx.random.normal((1, i), key=mx.random.key(7))).astype(mx.bfloat16)
            if a.check:
                # the same call with float32 weights and x, then the timed bf16 call
                _, call32, dense32 = make_weights(o, i, experts, bits, mx.float32, 1)
                e32 = check(call32, dense32, x.astype(mx.float32), 1e-5, f"{fmt} {shape} f32")
                e16 = check(call, dense, x, 5e-2, f"{fmt} {shape} bf16")
                print(f"# check {fmt:<9} {shape:<45} f32 {e32:.1e}  bf16 {e16:.1e}",
                      file=sys.stderr)
            us = time_calls(calls, x, iters, a.warmup) * 1e6
            gbs = nbytes / (us * 1e-6) / 1e9
            results.append({
                "format": fmt, "shape": shape, "experts": experts, "bytes": nbytes,
                "us_per_dispatch": us, "gbs": gbs,
                "frac_peak": (gbs / a.peak_gbs) if a.peak_gbs else None,
            })
            print(f"# {fmt:<9} {shape:<45} {us:>10.1f} us {gbs:>9.1f} GB/s", file=sys.stderr)
    device = mx.default_device()
    print(json.dumps({
        "adapter": f"{platform.machine()} {platform.system()} ({device})",
        "backend": f"MLX {mx.__version__} {'Metal' if mx.metal.is_available() else 'CPU'}",
        "timing": "wall clock around mx.eval of n back-to-back calls, median of 5",
        "quick": a.quick, "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
