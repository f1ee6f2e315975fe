#!/usr/bin/env bash
# Issue 16's closing figures on the device tool's NVIDIA H200 (Vulkan through the NVIDIA driver), one device call
# per step list, release binary built on an x86-64 host (stripped, gzipped) and carried in .dev/final/final.gz.
# Usage (on the device machine, from the repo root): tools/h200_final.sh STEP...
#   kernels    bench copy, bench kernels --json, and llama.cpp's Vulkan peer (../shared/peers/llamacpp, carried in
#              .dev/final/peer) on the same GPU: mm-cold mmid-cold
#   small42    synth --preset inkling-small --layers 42 --experts int4-g64 --routed-experts 6, then bench decode
#              --per-op --json, bench decode --gemv-prologues silu and norm,silu, bench prefill --prompt 512,2048 (default chunk 512), container removed
#   inkling66  the same for synth --preset inkling --layers 66 (decode only)
# (BENCHMARKS.md's figures came from commit 5a9e6b8, whose default was the folded prologues and whose
# --separate-prologues flag gave today's default.) Every output goes to $OUT; containers go to /dev/shm (the 64 GB disk takes writes at about 1.2 GB/s).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig >/dev/null 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
BIN=/tmp/inkling-wgpu; gunzip -c .dev/final/final.gz > $BIN; chmod +x $BIN
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$BIN bench copy | tee "$OUT/copy.txt"
peak=$(grep -oE 'ceiling: [0-9.]+' "$OUT/copy.txt" | cut -d' ' -f2)
summary() { python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
disp = d.get("dispatches") or {}
h = d["host_ms_per_step"]
print("summary: decode %.1f tok/s | %.3f ms/token | roofline %.1f tok/s | %.1f%% of roofline | %.0f bytes/token"
      % (d["decode_tok_s"], 1000 / d["decode_tok_s"], d["roofline_tok_s"], 100 * d["frac_roofline"], d["bytes_per_token"]))
print("summary: dispatches %s per step, %s fixed, %.2f per layer | host %.4f ms/step | GPU busy %s ms/step | host below GPU: %s"
      % (disp.get("per_step"), disp.get("fixed"), disp.get("per_layer", 0.0), h["record_finish_submit"],
         d.get("gpu_busy_ms_per_step"), d.get("host_below_gpu")))
PY
}
for step in "$@"; do
  echo "=== $step"
  case $step in
    kernels)
      $BIN bench kernels --json --peak-gbs "$peak" > "$OUT/kernels.json" 2> "$OUT/kernels.txt"; echo "rc=$?"
      cat "$OUT/kernels.txt"
      OUT=$OUT bash .dev/final/peer/run.sh mm-cold mmid-cold > "$OUT/peer.txt" 2>&1; echo "peer rc=$?"
      tail -60 "$OUT/peer.txt" ;;
    small42|inkling66)
      if [ $step = small42 ]; then preset=inkling-small; layers=42; else preset=inkling; layers=66; fi
      D=/dev/shm/depth-$step
      /usr/bin/time -f "synth wall %e s" $BIN synth --preset $preset --layers $layers --experts int4-g64 \
        --routed-experts 6 --out "$D" --force 2>&1 | tail -2
      $BIN bench decode --model "$D" --tokens 64 --per-op --json --peak-gbs "$peak" \
        > "$OUT/decode-$step.json" 2> "$OUT/decode-$step.txt"; echo "decode rc=$?"
      cat "$OUT/decode-$step.txt"; summary "$OUT/decode-$step.json"
      # the same probe with silu·up, then also the RMSNorms, folded into the GEMVs' x staging
      for kinds in silu norm,silu; do
        $BIN bench decode --model "$D" --tokens 64 --json --peak-gbs "$peak" --gemv-prologues $kinds \
          > "$OUT/decode-$step-prologues-$kinds.json" 2>/dev/null; echo "decode --gemv-prologues $kinds rc=$?"
        summary "$OUT/decode-$step-prologues-$kinds.json"
      done
      if [ $step = small42 ]; then
        $BIN bench prefill --model "$D" --prompt 512,2048 --repeat 2 --json > "$OUT/prefill-$step.json" \
          2> "$OUT/prefill-$step.txt"; echo "prefill rc=$?"
        cat "$OUT/prefill-$step.txt"
      fi
      rm -rf "$D" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
