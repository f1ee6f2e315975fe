#!/usr/bin/env bash
# Before/after decode on the device tool's H200: two release binaries (gzipped, stripped) in .dev/final/{before,after}.gz,
# run alternately twice on synth inkling-small int4-g64 probes with 6 routed experts (LAYERS, default "4 42"),
# then the after binary once with --per-op. Numbers: BENCHMARKS.md, "the architecture split, before and after".
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig >/dev/null 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
F=.dev/final; B=/tmp/before; A=/tmp/after
gunzip -c $F/before.gz > $B; gunzip -c $F/after.gz > $A; chmod +x $B $A
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$A bench copy | tee $OUT/copy.txt
peak=$(grep -oE 'ceiling: [0-9.]+' $OUT/copy.txt | cut -d' ' -f2)
sum() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))
print(sys.argv[2], 'tok/s %.1f ms/tok %.3f roof %.1f%%' % (d['decode_tok_s'], 1000/d['decode_tok_s'], 100*d['frac_roofline']), 'disp', d.get('dispatches'), 'host', d.get('host_ms_per_step'), 'gpu', d.get('gpu_busy_ms_per_step'))" $1 $2; }
for L in ${LAYERS:-4 42}; do
  D=/dev/shm/s$L
  /usr/bin/time -f "synth $L layers: %e s" $A synth --preset inkling-small --layers $L --experts int4-g64 --routed-experts 6 --out $D --force 2>&1 | tail -1
  for r in 1 2; do
    $B bench decode --model $D --tokens 64 --json --peak-gbs $peak > $OUT/b$L-$r.json 2>/dev/null; sum $OUT/b$L-$r.json before-$L-$r
    $A bench decode --model $D --tokens 64 --json --peak-gbs $peak > $OUT/a$L-$r.json 2>/dev/null; sum $OUT/a$L-$r.json after-$L-$r
  done
  $A bench decode --model $D --tokens 32 --per-op --json --peak-gbs $peak > $OUT/a$L-perop.json 2> $OUT/a$L-perop.txt; sum $OUT/a$L-perop.json after-perop-$L
  rm -rf $D
done
