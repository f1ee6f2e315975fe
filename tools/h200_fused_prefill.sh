#!/usr/bin/env bash
# Fused attention on/off (4 and 42 layers) and prefill GEMM vs GEMV on the H200; release binary gzipped in .dev/final/final.gz.
# Numbers: BENCHMARKS.md, "fused attention and the prefill GEMM" (measured with commit 0191e47, whose
# default was the split attention; since the fused attention is the default, --split-attention gives the other).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig >/dev/null 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
A=/tmp/final; gunzip -c .dev/final/final.gz > $A; chmod +x $A
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; peak=4173.7
sum() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
print(sys.argv[2], 'tok/s %.1f ms/tok %.3f roof %.1f%%' % (d['decode_tok_s'], 1000/d['decode_tok_s'], 100*d['frac_roofline']), 'disp', (d.get('dispatches') or {}).get('per_layer'), 'gpu', d.get('gpu_busy_ms_per_step'))" $1 $2; }
for L in 4 42; do
  D=/dev/shm/s$L
  $A synth --preset inkling-small --layers $L --experts int4-g64 --routed-experts 6 --out $D --force >/dev/null 2>&1
  for r in 1 2; do
    $A bench decode --model $D --tokens 64 --json --peak-gbs $peak --split-attention > $OUT/u$L-$r.json 2>/dev/null; sum $OUT/u$L-$r.json unfused-$L-$r
    $A bench decode --model $D --tokens 64 --json --peak-gbs $peak > $OUT/f$L-$r.json 2>/dev/null; sum $OUT/f$L-$r.json fused-attn-$L-$r
  done
  $A bench decode --model $D --tokens 32 --per-op --json --peak-gbs $peak 2>&1 >/dev/null | grep -E "attention|sum of kernels|dispatches per" 
  rm -rf $D
done
if $A bench prefill --help >/dev/null 2>&1; then
  D=/dev/shm/full4
  $A synth --preset inkling-small --layers 4 --experts int4-g64 --out $D --force 2>&1 | tail -1
  $A bench prefill --model $D --prompt 128,512,2048 --chunk 64,512 --repeat 1 --compare 2>&1 | tail -14
  rm -rf $D
fi
