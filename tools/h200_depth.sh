#!/usr/bin/env bash
# The full-depth decode probes of issue 16, on the device tool's NVIDIA H200 (Vulkan through the NVIDIA
# driver), with the release binary built on an x86-64 host and carried in .dev/.
# Usage (on the device machine, from the repo root): tools/h200_depth.sh PROBE...
#   small42    synth --preset inkling-small --layers 42 --experts int4-g64 --routed-experts 6 (13.78 GiB)
#   inkling66  synth --preset inkling --layers 66 --experts int4-g64 --routed-experts 6 (46.28 GiB)
# Both keep top-6 of 6 routed experts per layer: every shape and the expert bytes a decode token reads
# are those of the full model. For each probe: synth (timed), `bench decode --per-op --json` against the
# copy bandwidth of one `bench copy` at the start, a summary line, and the container removed again so
# that the next probe fits the disk. One probe per device call (each fits 600 s).
# Environment: BIN (default ./.dev/inkling-wgpu), OUT (default /tmp/out), TOKENS (decode steps, default 64),
# DEPTH_DIR (default /dev/shm: the device machine's tmpfs of 128 GB; its 64 GB disk takes writes at about
# 1.2 GB/s with fdatasync, which would bound synth there).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export WGPU_BACKEND=vulkan
BIN=${BIN:-./.dev/inkling-wgpu}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DIR=${DEPTH_DIR:-/dev/shm}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
df -h "$DIR" | tail -1
echo "=== bench copy"
$BIN bench copy | tee "$OUT/copy.txt"
peak=$(grep -oE 'ceiling: [0-9.]+' "$OUT/copy.txt" | cut -d' ' -f2)
for probe in "$@"; do
  case $probe in
    small42) preset=inkling-small; layers=42 ;;
    inkling66) preset=inkling; layers=66 ;;
    *) echo "unknown probe $probe (small42, inkling66)"; exit 2 ;;
  esac
  echo "=== $probe"
  D=$DIR/depth-$probe
  /usr/bin/time -f "synth wall %e s" $BIN synth --preset $preset --layers $layers --experts int4-g64 \
    --routed-experts 6 --out "$D" --force 2>&1 | tail -2
  du -sh "$D"
  $BIN bench decode --model "$D" --tokens "${TOKENS:-64}" --per-op --json --peak-gbs "${peak:-4250}" \
    > "$OUT/decode-$probe.json" 2> "$OUT/decode-$probe.err"
  echo "bench decode rc=$?"
  cat "$OUT/decode-$probe.err"
  python3 - "$OUT/decode-$probe.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
disp = d.get("dispatches") or {}
h = d["host_ms_per_step"]
print("summary: decode %.1f tok/s | roofline %.1f tok/s | %.1f%% of roofline | %.0f bytes/token"
      % (d["decode_tok_s"], d["roofline_tok_s"], 100 * d["frac_roofline"], d["bytes_per_token"]))
print("summary: dispatches %s per step, %s fixed, %.2f per layer | host %.4f ms/step (record+finish+submit) | GPU busy %s ms/step | host below GPU: %s"
      % (disp.get("per_step"), disp.get("fixed"), disp.get("per_layer", 0.0), h["record_finish_submit"],
         "%.4f" % d["gpu_busy_ms_per_step"] if d.get("gpu_busy_ms_per_step") is not None else "n/a",
         d.get("host_below_gpu")))
EOF
  rm -rf "$D"
done
