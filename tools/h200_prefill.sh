#!/usr/bin/env bash
# Prefill on the full-depth inkling-small probe (issue 16) on the device tool's H200, main's binary
# (.dev/final/final.gz) against this branch's (.dev/prefill/new.gz) in one call. Numbers:
# BENCHMARKS.md, "Prefill at full depth".
# Environment: OUT (default /tmp/out), TILES (tiles for `bench prefill --tiles` of the new binary),
# GEMM_TILES (tiles for `bench gemm`), CHUNKS (chunks of the new binary).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig >/dev/null 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
A=/tmp/main; gunzip -c .dev/final/final.gz > $A; chmod +x $A
B=/tmp/new; gunzip -c .dev/prefill/new.gz > $B; chmod +x $B
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
D=/dev/shm/s42
/usr/bin/time -f "synth wall %e s" $B synth --preset inkling-small --layers 42 --experts int4-g64 \
  --routed-experts 6 --out $D --force 2>&1 | tail -1
echo "=== main: bench decode --tokens 32"
$A bench decode --model $D --tokens 32 --json > $OUT/decode-main.json 2> $OUT/decode-main.err
python3 -c "import json;d=json.load(open('$OUT/decode-main.json'));print('decode tok/s %.1f' % d['decode_tok_s'])"
echo "=== main: bench prefill"
$A bench prefill --model $D --prompt 512,2048 --chunk 64,512 --repeat 1 2>&1 | tail -5
echo "=== new: bench prefill"
$B bench prefill --model $D --prompt 512,2048 --chunk ${CHUNKS:-512} --repeat 1 ${TILES:+--tiles $TILES} 2>&1 | grep -v "^adapter\|^model"
if [ -n "${GEMM_TILES:-}" ]; then
  echo "=== new: bench gemm"
  $B bench gemm --formats bf16,int4-g64 --dense-only --tokens 512 --tiles $GEMM_TILES --iters 4 2>&1 | tail -20
fi
rm -rf $D
