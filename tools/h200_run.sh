#!/usr/bin/env bash
# What the numbers in BENCHMARKS.md and the issue notes came from: run on the device tool's NVIDIA H200
# (Vulkan through the NVIDIA driver), with the release binary built on an x86-64 host and carried in .dev/.
# Usage (on the device machine, from the repo root): tools/h200_run.sh STEP...  (steps: smoke bench generate convert stream decode)
# stream: LAYERS (default 10) layers of synth inkling-small int4-g64, generated with 100%, 50% and 25% of the
# routed experts as GPU slots, warm page cache then cold (pages dropped with posix_fadvise DONTNEED).
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
      peak=$(grep -oE 'ceiling: [0-9.]+' "$OUT/copy.txt" | cut -d' ' -f2)
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
    stream)
      L=${LAYERS:-10}; D=${STREAM_DIR:-/tmp/small}; total=$((L * 256))
      ids=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
      df -h /tmp | tail -1
      /usr/bin/time -f "synth %e s" $BIN synth --preset inkling-small --layers "$L" --experts int4-g64 --out "$D" --force | tail -1
      du -sh "$D"
      cold() { python3 -c "
import os, sys
d = sys.argv[1]
for f in os.listdir(d):
    fd = os.open(os.path.join(d, f), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
" "$D"; grep -E '^(Cached|MemFree)' /proc/meminfo | tr -s ' \n' ' '; echo; }
      run() { # tag slots [extra...]
        local tag=$1 slots=$2; shift 2
        local t0=$(date +%s.%N)
        $BIN generate --model "$D" --prompt-ids "$ids" --max-tokens 32 --temperature 0 --json --expert-slots "$slots" "$@" > "$OUT/cur.json" 2> "$OUT/cur.err"
        echo "[$tag] rc=$? wall $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
        { echo "[$tag]"; cat "$OUT/cur.json"; } >> "$OUT/stream.jsonl"; { echo "[$tag]"; cat "$OUT/cur.err"; } >> "$OUT/stream.err"
        python3 -c "
import json;d=json.load(open('$OUT/cur.json'));s=d['stats']
print('  ids', d['generated_ids']); print('  decode %.2f tok/s  prefill %.2f s' % (s['decode_tok_s'], s['prefill_s'])); print('  experts', json.dumps(s['experts']))"
        tail -4 "$OUT/cur.err"
      }
      run warm-100 $total --usage-file off
      run warm-50 $((total / 2)) --usage-file off
      run warm-25 $((total / 4)) --usage-file off
      cold; run cold-25 $((total / 4)) --usage-file off
      cold; run cold-50 $((total / 4 * 2)) --usage-file off
      run hot-write-25 $((total / 4)) --usage-file "$OUT/usage.json"
      run hot-read-25 $((total / 4)) --usage-file "$OUT/usage.json" --profile --peak-gbs 4171.7
      rm -f "$OUT/cur.json" "$OUT/cur.err" ;;
    decode)
      # DECODE_LAYERS (default 4) layers of synth inkling-small int4-g64, the issue's decode probe
      D=${DECODE_DIR:-/tmp/s${DECODE_LAYERS:-4}}
      [ -f "$D/config.json" ] || $BIN synth --preset inkling-small --layers "${DECODE_LAYERS:-4}" --experts int4-g64 --out "$D" | tail -1
      $BIN bench decode --model "$D" --tokens 64 --per-op --json > "$OUT/decode.json"; echo "rc=$?"
      python3 -c "import json;d=json.load(open('$OUT/decode.json'));print({k: d[k] for k in ('decode_tok_s','roofline_tok_s','frac_roofline','steps_gpu') if k in d})" ;;
  esac
done
