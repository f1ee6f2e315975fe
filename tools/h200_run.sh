#!/usr/bin/env bash
# What the numbers in BENCHMARKS.md and the issue notes came from: run on the device tool's NVIDIA H200
# (Vulkan through the NVIDIA driver), with the release binary built on an x86-64 host and carried in .dev/.
# Usage (on the device machine, from the repo root): tools/h200_run.sh STEP...  (steps: smoke bench generate convert)
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export WGPU_BACKEND=vulkan
BIN=./.dev/inkling-wgpu
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for step in "$@"; do
  echo "=== $step"
  case $step in
    smoke)
      $BIN smoke; echo "rc=$?"
      $BIN smoke --force-ordinal 42; echo "rc=$?"
      $BIN smoke --force-ordinal 6; echo "rc=$?" ;;
    bench)
      $BIN bench copy | tee "$OUT/copy.txt"
      peak=$(grep -oE '[0-9]+(\.[0-9]+)? GB/s' "$OUT/copy.txt" | head -1 | cut -d' ' -f1)
      $BIN bench kernels --peak-gbs "${peak:-4250}"
      $BIN bench kernels --json --peak-gbs "${peak:-4250}" > "$OUT/wgpu.json"
      python3 benches/native/torch_gemv.py --peak-gbs "${peak:-4250}" > "$OUT/torch.json"
      $BIN bench compare "$OUT/wgpu.json" "$OUT/torch.json" ;;
    generate)
      for m in tiny-causal-f32 tiny-mm-bf16 tiny-causal-bf16-sharded; do
        ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('tests/fixtures/$m/reference.json'))['cases'][0]['prompt_ids'])))")
        ref=$(python3 -c "import json;print(json.load(open('tests/fixtures/$m/reference.json'))['cases'][0]['generated_ids'])")
        for dev in gpu cpu; do
          got=$($BIN generate --model tests/fixtures/$m --prompt-ids "$ids" --temperature 0 --device $dev --json)
          echo "$m $dev: $got"
        done
        echo "$m transformers: $ref"
      done
      $BIN generate --prompt "Once upon a time" --max-tokens 32 ;;
    convert)
      for e in int4-g64 int3-g64; do
        $BIN convert --model tests/fixtures/tiny-mm-bf16 --out /tmp/conv-$e --experts $e
        $BIN info --model /tmp/conv-$e | tail -5
        for dev in gpu cpu; do
          $BIN generate --model /tmp/conv-$e --prompt-ids 5,6,7,8,9,10,11,12 --max-tokens 16 --temperature 0 --device $dev --json
        done
      done ;;
  esac
done
