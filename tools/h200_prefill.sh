#!/usr/bin/env bash
# Prefill on the full-depth inkling-small probe (issue 16) on the device tool's H200: main's binary
# (.dev/final/final.gz) against this branch's (.dev/prefill/new.gz, and .dev/prefill/a.gz when
# present: an earlier build of the branch) in one call. Numbers: BENCHMARKS.md, "Prefill at full
# depth". Environment: OUT (default /tmp/out), TILES (`bench prefill --tiles` of the new binaries),
# A_TILES (the same for a.gz), CHUNKS (their --chunk, default 512), GEMM_TILES (`bench gemm --tiles` of new.gz;
# no bench gemm when empty).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig >/dev/null 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=/tmp/main; gunzip -c .dev/final/final.gz > $M; chmod +x $M
NEW=()
for n in a new; do
  if [ -f .dev/prefill/$n.gz ]; then gunzip -c .dev/prefill/$n.gz > /tmp/$n; chmod +x /tmp/$n; NEW+=(/tmp/$n); fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
D=/dev/shm/s42
/usr/bin/time -f "synth wall %e s" $M synth --preset inkling-small --layers 42 --experts int4-g64 \
  --routed-experts 6 --out $D --force 2>&1 | tail -1
echo "=== main: bench decode --tokens 32"
$M bench decode --model $D --tokens 32 --json > $OUT/decode-main.json 2> $OUT/decode-main.err
python3 -c "import json;d=json.load(open('$OUT/decode-main.json'));print('decode tok/s %.1f' % d['decode_tok_s'])"
echo "=== main: bench prefill --prompt 512,2048 --chunk 64,512 --repeat 1"
$M bench prefill --model $D --prompt 512,2048 --chunk 64,512 --repeat 1 2>&1 | tail -5
for B in "${NEW[@]}"; do
  T=${TILES:-}; [ "$B" = /tmp/a ] && T=${A_TILES:-$T}
  echo "=== $B: bench prefill --prompt 512,2048 --chunk ${CHUNKS:-512} --repeat 1 ${T:+--tiles $T}"
  $B bench prefill --model $D --prompt 512,2048 --chunk ${CHUNKS:-512} --repeat 1 ${T:+--tiles $T} 2>&1 | grep -v "^adapter\|^model"
  if [ -n "${GEMM_TILES:-}" ] && [ "$B" != /tmp/a ]; then
    echo "=== $B: bench gemm --formats bf16,int4-g64 --dense-only --tokens 512 --tiles $GEMM_TILES --iters 4"
    $B bench gemm --formats bf16,int4-g64 --dense-only --tokens 512 --tiles $GEMM_TILES --iters 4 2>&1 | grep "gemm [0-9]"
  fi
done
rm -rf $D
