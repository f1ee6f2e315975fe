#!/usr/bin/env bash
# device_bench.sh: the benchmarks of BENCHMARKS.md, run on the device tool's NVIDIA H200 (Vulkan through
# the NVIDIA driver) with one or more release binaries in one device call, so that every ratio between
# them comes from one machine, one driver and one warm-up.
#
# Usage (on the device machine, from the repository root, with `.gl` and `.dev` carried):
#   BINS="base=.dev/base.gz new=.dev/new.gz" bash tools/device_bench.sh STEP...
#   bash tools/device_bench.sh --dry-run STEP...         print the commands, run nothing (works anywhere)
#   bash tools/device_bench.sh --summary KIND FILE [LABEL]  print the summary line of one output file
#                                                        (KIND: decode, prefill, gemm, kernels, peer, stream, generate, batch, serve)
#
# BINS   space-separated NAME=PATH: release binaries (`cargo build --release`, stripped, gzipped when the
#        name ends in .gz) carried in .dev/ (ignored by git: name `.dev` in the device call's carry).
#        NAME labels every line: use the commit (e.g. "04a4b0a=.dev/base.gz"). Default: main=.dev/inkling-wgpu.
# STEP   any of, run in the order given (copy is measured first in any case, unless PEAK_GBS is set):
#   copy       `bench copy` with every binary; the first binary's ceiling is the --peak-gbs of later steps
#   smoke      `smoke` with every binary (every weight format against the CPU on the device)
#   kernels    `bench kernels --json --peak-gbs C` with every binary (`bench compare` of each against the
#              first), then llama.cpp's Vulkan peer (`run.sh mm-cold mmid-cold`) once, if PEER is carried;
#              TORCH=1 adds benches/native/torch_gemv.py and `bench compare` of the first binary against it
#   gemm       `bench gemm --json` with every binary (the prefill GEMM against the GEMV on a chunk's dense
#              and routed projections, bf16, int4-g64 and int3-g64, 64/512/2048 tokens); GEMM_TILES (e.g.
#              2x32,1x32) adds `--tiles`: those tiles timed beside the GEMV and the automatic choice
#   decode     for each probe of PROBES: `synth` once into /dev/shm, then `bench decode --tokens 64 --json
#              --peak-gbs C` with every binary, alternating binaries for ROUNDS rounds (noise shows as the
#              spread within one binary), then one line with every binary's tok/s side by side; PEROP=1
#              adds one `--per-op` run per binary; the container is removed after its probe
#   prefill    `bench prefill --prompt 512,2048 --repeat 2 --json` with every binary on each probe of PREFILL_PROBE;
#              PREFILL_TILES (e.g. 4x16,2x32) adds `--tiles`: one model per tile, whose GEMM calls use it
#   stream     for each format of STREAM_FORMATS: an 8-layer inkling-small with all 256 routed experts per
#              layer, then `generate --expert-slots N --usage-file off` (16 prompt ids, 32 greedy tokens)
#              with every binary at 100%, 50% and 25% of the routed experts as slots (page cache warm);
#              STREAM_COLD=1 adds 25% with the container's pages dropped first
#   generate   for each format of GEN_FORMATS: an 8-layer inkling-small with all 256 routed experts per
#              layer, resident, then with every binary `bench decode --tokens 64` and `generate --json` (16
#              prompt ids, greedy, GEN_TOKENS tokens each, one process per run): its stats.token_times_s,
#              when each token reached the host, against its steady rate and `bench decode`, to test
#              whether `generate` pays a start-up cost (BENCHMARKS.md#decode-generate)
#   model-peer llama.cpp's model-level peer (MODEL_PEER/run.sh MODEL_PEER_WHICH), its RESULT lines
#   batch      for each probe of PROBES and then (BATCH_FULL=1, the default) an 8-layer inkling-small with all
#              256 routed experts per layer (int4-g64): `bench batch --batch BATCHES --tokens TOKENS` with every
#              binary (the full container also once streamed through all expert slots but one, which counts
#              the distinct experts a step reads), then `serve --parallel MAX(BATCHES)` and
#              benches/serve_bench.py (completions, SERVE_TOKENS-token greedy answers) at BATCHES clients
# Probes (PROBES, PREFILL_PROBE): each keeps every shape and the expert bytes a decode token reads of
# the full model (`synth --routed-experts 6`: top-6 of 6 routed experts per layer):
#   small42       synth --preset inkling-small --layers 42 --experts int4-g64 --routed-experts 6  (13.8 GiB)
#   small42-int3  the same with --experts int3-g64
#   inkling66     synth --preset inkling --layers 66 --experts int4-g64 --routed-experts 6        (46.3 GiB)
# Environment (defaults): PROBES (small42), PREFILL_PROBE (small42), ROUNDS (2), TOKENS (64), PEROP (0), TORCH (0),
#   PEAK_GBS (measured by `bench copy`), SYNTH_BIN (the first binary's NAME: it writes every container),
#   PROMPTS (512,2048), BATCHES (1,2,4,8), SERVE_TOKENS (128), BATCH_FULL (1), STREAM_FORMATS (int4-g64), STREAM_LAYERS (8), STREAM_COLD (0),
#   GEN_FORMATS (int3-g64 int4-g64), GEN_TOKENS (128 512),
#   PEER (.dev/peer, else shared/peers/llamacpp: a copy of ../shared/peers/llamacpp, which does not
#   travel by itself), MODEL_PEER (.dev/peer-model, else shared/peers/llamacpp-model), MODEL_PEER_WHICH
#   (small), SHM (/dev/shm: the machine's 64 GB disk takes writes at about 1.2 GB/s, tmpfs does not),
#   OUT (set by the device tool; /tmp/out otherwise).
# Output: every command's text and JSON under a work folder, packed at the end into $OUT/device_bench.tgz
# (one file: the device tool brings back at most 8), and every `summary` line, also in $OUT/summary.txt.
# Time: one device call runs at most 600 s; `copy decode` with two binaries on small42 fits, the
# 66-layer probe and `stream` are better given a call of their own.
#
# Example, the before/after decode of a change (from this machine's repository root):
#   cargo build --release && mkdir -p .dev && gzip -c target/release/inkling-wgpu > .dev/new.gz
#   (the same for the base commit's build into .dev/base.gz), then one device call with carry [".gl", ".dev"]:
#   BINS="base=.dev/base.gz new=.dev/new.gz" bash tools/device_bench.sh copy decode
set -uo pipefail

DRY=0
if [ "${1:-}" = --summary ]; then MODE=summary; shift
elif [ "${1:-}" = --dry-run ]; then DRY=1; MODE=run; shift
else MODE=run; fi

# the device machine's Vulkan loader and the GL vendor-neutral libraries the NVIDIA ICD (libGLX_nvidia)
# needs, carried in .gl: `(mkdir -p .gl && cd .gl && apt-get download libvulkan1 libegl1 libglvnd0
# libopengl0 libgl1 libglx0 libgles2)` (with libvulkan1 alone the loader finds no vkCreateInstance), and
# (elsewhere, with no .gl and no ICD there, the system's Vulkan is used as it is)
if [ "$MODE" = run ] && [ "$DRY" = 0 ]; then
  if ls .gl/*.deb >/dev/null 2>&1; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
  ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$ICD" ] && export VK_DRIVER_FILES=$ICD
  export WGPU_BACKEND=vulkan NODEVICE_SELECT=1
fi

# summary KIND FILE [LABEL]: one line from one output file of the binaries (or of the peers)
summary() {
  python3 - "$@" <<'PY'
import json, sys

kind, path = sys.argv[1], sys.argv[2]
label = sys.argv[3] if len(sys.argv) > 3 else path


def fmt(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


if kind == "decode":
    d = json.load(open(path))
    disp = d.get("dispatches") or {}
    h = d.get("host_ms_per_step") or {}
    tok = d["decode_tok_s"]
    print("summary: decode %s: %.1f tok/s | %.3f ms/token | roofline %.1f tok/s | %.1f%% of roofline"
          " | %.0f bytes/token | dispatches %s per step, %s fixed, %s per layer"
          " | host %s ms/step (record+finish+submit) | GPU busy %s ms/step | host below GPU: %s"
          % (label, tok, 1000 / tok if tok else 0.0, d["roofline_tok_s"], 100 * d["frac_roofline"],
             d["bytes_per_token"], disp.get("per_step"), disp.get("fixed"),
             fmt(disp.get("per_layer"), ".2f"), fmt(h.get("record_finish_submit"), ".4f"),
             fmt(d.get("gpu_busy_ms_per_step"), ".4f"), d.get("host_below_gpu")))
elif kind == "prefill":
    d = json.load(open(path))
    parts = ["%s chunk %s prompt %s: TTFT %.1f ms, %.1f tok/s"
             % (r["kernel"], r["chunk"], r["prompt_tokens"], 1000 * r["ttft_s"], r["prefill_tok_s"])
             for r in d["results"]]
    print("summary: prefill %s: %s" % (label, " | ".join(parts)))
elif kind == "kernels":
    d = json.load(open(path))
    want = ("inkling moe-layer gate_up 8x[6144x6144]", "inkling moe-layer down 8x[6144x3072]",
            "inkling-small routed gate_up 6x[4096x4096]", "inkling-small routed down 6x[4096x2048]",
            "inkling gate_up [6144x6144]")
    short = {w: w.split(" ")[-1] for w in want}
    rows = {}
    for r in d["results"]:
        if r["shape"] in want:
            rows.setdefault(r["format"], []).append(
                "%s %.1f us %s" % (short[r["shape"]], r["us_per_dispatch"],
                                   fmt(r.get("frac_peak") and 100 * r["frac_peak"], ".1f", "-") + "%"))
    text = " || ".join("%s %s" % (f, ", ".join(v)) for f, v in rows.items()
                       if f in ("int4-g64", "int4-g32", "int3-g64", "bf16"))
    print("summary: kernels %s: %s" % (label, text or "none of the listed shapes"))
elif kind == "peer":
    # run.sh's table: op type_a n_mats m k peer rot us_per_run GiB_per_s GB_per_s_1e9 kB_per_run
    want = {("MUL_MAT", "q4_0", "6144", "6144"), ("MUL_MAT", "q3_K", "6144", "6144"),
            ("MUL_MAT", "bf16", "6144", "6144"), ("MUL_MAT_ID", "q4_0", "6144", "3072"),
            ("MUL_MAT_ID", "q4_0", "4096", "4096"), ("MUL_MAT_ID", "q4_0", "4096", "2048"),
            ("MUL_MAT_ID", "q3_K", "6144", "3072"), ("MUL_MAT_ID", "q3_K", "4096", "4096"),
            ("MUL_MAT_ID", "q3_K", "4096", "2048")}
    parts = []
    for line in open(path):
        c = line.rstrip("\n").split("\t")
        if len(c) >= 8 and (c[0], c[1], c[3], c[4]) in want and c[5] == "cold":
            parts.append("%s %s %sx%s %s us" % ("8 of 256" if c[0] == "MUL_MAT_ID" else "one", c[1], c[3], c[4], c[7]))
    print("summary: kernels %s: %s" % (label, " | ".join(parts) or "no rows"))
elif kind == "stream":
    # one generate --json document per line, each prefixed by "TAG\t"
    ref, parts = None, []
    for line in open(path):
        tag, _, doc = line.partition("\t")
        try:
            d = json.loads(doc)
        except ValueError:
            parts.append("%s failed" % tag)
            continue
        s, ids = d["stats"], d["generated_ids"]
        ref = ids if ref is None else ref
        x = s.get("experts") or {}
        extra = "" if x.get("resident") else ", hit rate %s, host copy %s GB/s" % (
            fmt(x.get("hit_rate") and 100 * x["hit_rate"], ".1f") + "%", fmt(x.get("upload_gbs"), ".2f"))
        parts.append("%s %.1f tok/s%s, ids %s" % (tag, s["decode_tok_s"], extra,
                                                 "= first" if ids == ref else "DIFFER"))
    print("summary: stream %s: %s" % (label, " | ".join(parts)))
elif kind == "gemm":
    # the engine's own choice (kernel "auto=...") per format, shape and chunk: its ratio to the GEMV
    d = json.load(open(path))
    parts = ["%s %s %d tok %s %.2fx" % (r["format"], r["shape"], r["tokens"], r["kernel"],
                                        r["speedup_vs_gemv"])
             for r in d["results"] if r["kernel"].startswith("auto")]
    print("summary: gemm %s: %s" % (label, " | ".join(parts) or "no rows"))
elif kind == "generate":
    # one generate --json document per line, each prefixed by "TAG\t": its decode rate, then the
    # mean interval between tokens (stats.token_times_s) over ranges of the token index
    import statistics
    parts = []
    for line in open(path):
        tag, _, doc = line.partition("\t")
        try:
            s = json.loads(doc)["stats"]
        except (ValueError, KeyError):
            parts.append("%s failed" % tag)
            continue
        t = s.get("token_times_s") or []
        gaps = [1e3 * (b - a) for a, b in zip(t, t[1:])]
        ranges = ["%d-%d %.3f" % (lo, min(hi, len(gaps)), statistics.mean(gaps[lo:hi]))
                  for lo, hi in ((0, 8), (8, 32), (32, 128), (128, 512), (512, 2048)) if gaps[lo:hi]]
        parts.append("%s %.1f tok/s, TTFT %.3f s, ms between tokens %s"
                     % (tag, s["decode_tok_s"], s["ttft_s"], ", ".join(ranges) or "none"))
    print("summary: generate %s: %s" % (label, " | ".join(parts)))
elif kind == "batch":
    d = json.load(open(path))
    parts = ["B=%d %.2f ms/step %.1f tok/s (x%s)%s" % (
        r["batch"], r["step_ms"], r["aggregate_tok_s"], fmt(r.get("vs_batch_1"), ".2f"),
        "" if r.get("experts_per_layer_step") is None else ", %.1f experts/layer/step" % r["experts_per_layer_step"])
        for r in d["batches"]]
    print("summary: batch %s: solo pipelined %.1f tok/s | %s" % (label, d["solo_pipelined_tok_s"], " | ".join(parts)))
elif kind == "serve":
    d = json.load(open(path))
    base = None
    parts = []
    for lv in d["levels"]:
        agg, ttft = lv["aggregate_tok_s"], lv["ttft_s"]["median"]
        base = base or (agg, ttft)
        parts.append("%d clients: %.1f tok/s aggregate (x%.2f), per request %.1f, TTFT median %.1f ms (x%.2f) max %.1f ms, errors %d"
                     % (lv["concurrency"], agg, agg / base[0], lv["per_request_tok_s"]["median"], 1000 * ttft,
                        ttft / base[1], 1000 * lv["ttft_s"]["max"], lv["errors"]))
    print("summary: serve %s: %s" % (label, " | ".join(parts)))
else:
    sys.exit("unknown summary kind %s (decode, prefill, gemm, kernels, peer, stream, generate, batch, serve)" % kind)
PY
}

if [ "$MODE" = summary ]; then
  [ $# -ge 2 ] || { echo "usage: $0 --summary KIND FILE [LABEL]" >&2; exit 2; }
  summary "$@"; exit $?
fi

[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
for step in "$@"; do
  case $step in copy|smoke|kernels|gemm|decode|prefill|stream|generate|model-peer|batch) ;;
    *) echo "unknown step '$step' (copy smoke kernels gemm decode prefill stream generate model-peer batch)" >&2; exit 2 ;;
  esac
done
probe_args() { # probe -> synth arguments
  case $1 in
    small42) echo "--preset inkling-small --layers 42 --experts int4-g64 --routed-experts 6" ;;
    small42-int3) echo "--preset inkling-small --layers 42 --experts int3-g64 --routed-experts 6" ;;
    inkling66) echo "--preset inkling --layers 66 --experts int4-g64 --routed-experts 6" ;;
    *) return 1 ;;
  esac
}
PROBES=${PROBES:-small42}; PREFILL_PROBE=${PREFILL_PROBE:-small42}
for p in $PROBES $PREFILL_PROBE; do
  probe_args "$p" >/dev/null || { echo "unknown probe '$p' (small42 small42-int3 inkling66)" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-2}; TOKENS=${TOKENS:-64}; PROMPTS=${PROMPTS:-512,2048}
STREAM_FORMATS=${STREAM_FORMATS:-int4-g64}; STREAM_LAYERS=${STREAM_LAYERS:-8}
GEN_FORMATS=${GEN_FORMATS:-int3-g64 int4-g64}; GEN_TOKENS=${GEN_TOKENS:-128 512}
BATCHES=${BATCHES:-1,2,4,8}; SERVE_TOKENS=${SERVE_TOKENS:-128}; BATCH_FULL=${BATCH_FULL:-1}
SHM=${SHM:-/dev/shm}; OUT=${OUT:-/tmp/out}
W=/tmp/device_bench; [ "$DRY" = 1 ] && { W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; }; SUMMARY=$W/summary.txt

# the binaries: NAMES[i] runs BIN[NAME]
declare -a NAMES=(); declare -A BIN=() SRC=()
for entry in ${BINS:-main=.dev/inkling-wgpu}; do
  name=${entry%%=*}; path=${entry#*=}
  [ "$name" != "$entry" ] && [ -n "$name" ] && [ -n "$path" ] || { echo "BINS entry '$entry' is not NAME=PATH" >&2; exit 2; }
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "BINS name '$name': letters, digits, . _ - only" >&2; exit 2; }
  [ -z "${BIN[$name]:-}" ] || { echo "BINS names '$name' twice" >&2; exit 2; }
  NAMES+=("$name"); SRC[$name]=$path; BIN[$name]=$W/bin/$name
done
SYNTH_BIN=${SYNTH_BIN:-${NAMES[0]}}
[ -n "${BIN[$SYNTH_BIN]:-}" ] || { echo "SYNTH_BIN '$SYNTH_BIN' is not a name in BINS" >&2; exit 2; }
find_dir() { for d in "$@"; do [ -f "$d/run.sh" ] && { echo "$d"; return 0; }; done; return 1; }
PEER=${PEER:-$(find_dir .dev/peer shared/peers/llamacpp || echo .dev/peer)}
MODEL_PEER=${MODEL_PEER:-$(find_dir .dev/peer-model shared/peers/llamacpp-model || echo .dev/peer-model)}

# x CMD...: run (or, with --dry-run, print) one command
exec 3>&1
x() { if [ "$DRY" = 1 ]; then echo "+ $*" >&3; else "$@"; fi; }
say() { echo "$*" | tee -a "$SUMMARY"; }
sum() { [ "$DRY" = 1 ] && { echo "+ summary $*"; return 0; }; summary "$@" | tee -a "$SUMMARY"; }

if [ "$DRY" = 0 ]; then
  rm -rf "$W"; mkdir -p "$W/bin" "$OUT"; : > "$SUMMARY"
  pack() { rm -rf "$SHM"/device_bench-*; tar -C /tmp -czf "$OUT/device_bench.tgz" --exclude=device_bench/bin device_bench
           cp "$SUMMARY" "$OUT/summary.txt"; }
  trap pack EXIT
  for n in "${NAMES[@]}"; do
    s=${SRC[$n]}; [ -f "$s" ] || { echo "binary $n: no file $s (carry .dev)" >&2; exit 2; }
    case $s in *.gz) gunzip -c "$s" > "${BIN[$n]}" ;; *) cp "$s" "${BIN[$n]}" ;; esac; chmod +x "${BIN[$n]}"
  done
  exec > >(tee -a "$W/log.txt") 2>&1
  say "summary: machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1), $(nproc) cores"
  df -h "$SHM" | tail -1
fi
for n in "${NAMES[@]}"; do echo "binary $n: ${SRC[$n]}"; done

# the copy ceiling every --peak-gbs uses
copy() { # name
  local n=$1 f=$W/copy-$1.txt
  x "${BIN[$n]}" bench copy > "$f" 2>&1 || echo "bench copy ($n) failed: rc $?"
  [ "$DRY" = 1 ] && return 0
  cat "$f"; say "summary: copy $n: $(grep -E 'copy_buffer_to_buffer|compute-shader|ceiling' "$f" | tr -s ' ' | sed 's/^ //' | paste -sd '|' | sed 's/|/ | /g')"
}
COPIED=" "
if [ -n "${PEAK_GBS:-}" ]; then peak=$PEAK_GBS
else
  copy "${NAMES[0]}"; peak=$( [ "$DRY" = 1 ] && echo C || grep -oE 'ceiling: [0-9.]+' "$W/copy-${NAMES[0]}.txt" | cut -d' ' -f2)
  [ -n "$peak" ] || { echo "no ceiling from bench copy; set PEAK_GBS" >&2; exit 1; }
  COPIED=" ${NAMES[0]} "
fi
echo "copy ceiling for --peak-gbs: $peak GB/s"

# ensure_probe NAME ARGS...: the container DIR=$SHM/device_bench-NAME written once by SYNTH_BIN (others removed)
ensure_probe() {
  local p=$1; shift; DIR=$SHM/device_bench-$p
  [ "$DRY" = 0 ] && [ -f "$DIR/config.json" ] && return 0
  [ "$DRY" = 0 ] && for d in "$SHM"/device_bench-*; do [ "$d" != "$DIR" ] && rm -rf "$d"; done
  echo "=== synth $p: $*"
  local t0=$SECONDS
  x "${BIN[$SYNTH_BIN]}" synth "$@" --out "$DIR" --force > "$W/synth-$p.txt" 2>&1 || { echo "synth $p failed"; cat "$W/synth-$p.txt"; rm -rf "$DIR"; return 1; }
  [ "$DRY" = 0 ] && { tail -2 "$W/synth-$p.txt"; say "summary: synth $p: $((SECONDS - t0)) s, $(du -sh "$DIR" | cut -f1)"; }
  return 0
}

declare -A DECODE_TOK=()
for step in "$@"; do
  echo "=== $step"
  case $step in
    copy)
      for n in "${NAMES[@]}"; do [[ $COPIED == *" $n "* ]] || copy "$n"; done ;;
    smoke)
      for n in "${NAMES[@]}"; do
        x "${BIN[$n]}" smoke > "$W/smoke-$n.txt" 2>&1; rc=$?
        [ "$DRY" = 0 ] && { cat "$W/smoke-$n.txt"; say "summary: smoke $n: rc $rc | $(tail -1 "$W/smoke-$n.txt")"; }
      done ;;
    kernels)
      for n in "${NAMES[@]}"; do
        x "${BIN[$n]}" bench kernels --json --peak-gbs "$peak" > "$W/kernels-$n.json" 2> "$W/kernels-$n.txt" \
          || echo "bench kernels ($n) failed: rc $?"
        [ "$DRY" = 0 ] && cat "$W/kernels-$n.txt"
        sum kernels "$W/kernels-$n.json" "$n"
        if [ "$n" != "${NAMES[0]}" ]; then
          echo "--- bench compare $n / ${NAMES[0]}"
          x "${BIN[$n]}" bench compare "$W/kernels-$n.json" "$W/kernels-${NAMES[0]}.json"
        fi
      done
      if [ "${TORCH:-0}" = 1 ]; then
        echo "--- PyTorch (cuBLAS bf16, torch._weight_int4pack_mm int4) on the same shapes"
        x python3 benches/native/torch_gemv.py --peak-gbs "$peak" > "$W/torch.json" 2> "$W/torch.txt" || echo "torch_gemv.py failed: rc $?"
        x "${BIN[${NAMES[0]}]}" bench compare "$W/kernels-${NAMES[0]}.json" "$W/torch.json"
      fi
      if [ -f "$PEER/run.sh" ] || [ "$DRY" = 1 ]; then
        echo "--- llama.cpp Vulkan peer: $PEER/run.sh mm-cold mmid-cold"
        OUT=$W/peer x bash "$PEER/run.sh" mm-cold mmid-cold > "$W/peer.txt" 2>&1 || echo "peer failed: rc $?"
        [ "$DRY" = 0 ] && tail -80 "$W/peer.txt"
        sum peer "$W/peer/llamacpp-perf-mm-cold-mmid-cold.tsv" llama.cpp
      else
        echo "no llama.cpp peer at $PEER (copy ../shared/peers/llamacpp into .dev/peer and carry .dev)"
      fi ;;
    gemm)
      for n in "${NAMES[@]}"; do
        f=$W/gemm-$n
        x "${BIN[$n]}" bench gemm --json ${GEMM_TILES:+--tiles "$GEMM_TILES"} > "$f.json" 2> "$f.txt" || { echo "bench gemm ($n) failed: rc $?"; cat "$f.txt"; continue; }
        [ "$DRY" = 0 ] && cat "$f.txt"
        sum gemm "$f.json" "$n"
      done ;;
    decode)
      for p in $PROBES; do
        ensure_probe "$p" $(probe_args "$p") || continue
        for r in $(seq 1 "$ROUNDS"); do
          for n in "${NAMES[@]}"; do
            f=$W/decode-$p-$n-$r
            x "${BIN[$n]}" bench decode --model "$DIR" --tokens "$TOKENS" --json --peak-gbs "$peak" > "$f.json" 2> "$f.txt" \
              || { echo "bench decode ($p, $n, round $r) failed: rc $?"; cat "$f.txt"; continue; }
            sum decode "$f.json" "$p $n round $r"
            [ "$DRY" = 0 ] && DECODE_TOK[$p $n]="${DECODE_TOK[$p $n]:+${DECODE_TOK[$p $n]} }$(python3 -c "import json,sys;print('%.1f' % json.load(open(sys.argv[1]))['decode_tok_s'])" "$f.json")"
          done
        done
        if [ "${PEROP:-0}" = 1 ]; then
          for n in "${NAMES[@]}"; do
            f=$W/decode-$p-$n-perop
            x "${BIN[$n]}" bench decode --model "$DIR" --tokens "$TOKENS" --per-op --json --peak-gbs "$peak" > "$f.json" 2> "$f.txt" \
              || { echo "bench decode --per-op ($p, $n) failed: rc $?"; continue; }
            [ "$DRY" = 0 ] && cat "$f.txt"
            sum decode "$f.json" "$p $n per-op"
          done
        fi
        [ "$DRY" = 1 ] && continue
        line="summary: decode $p side by side (tok/s, round by round):"
        sep=" "; for n in "${NAMES[@]}"; do line="$line$sep$n ${DECODE_TOK[$p $n]:-failed}"; sep=" | "; done
        if [ "${#NAMES[@]}" -gt 1 ]; then
          pairs=(); for n in "${NAMES[@]}"; do pairs+=("$n=${DECODE_TOK[$p $n]:-}"); done
          line="$line | $(python3 - "${pairs[@]}" <<'PY'
import statistics, sys
runs = [(a.split("=", 1)[0], [float(v) for v in a.split("=", 1)[1].split()]) for a in sys.argv[1:]]
(base_name, base), out = runs[0], []
for n, v in runs[1:]:
    if base and v:
        out.append("%s/%s %.3f (medians)" % (n, base_name, statistics.median(v) / statistics.median(base)))
print(" | ".join(out) or "no ratio")
PY
)"
        fi
        say "$line"
        [[ " $PREFILL_PROBE " == *" $p "* ]] && [[ " $* " == *" prefill "* ]] || rm -rf "$DIR"
      done ;;
    prefill)
      # a probe whose container the decode step left goes first (ensure_probe removes the others)
      order=(); for p in $PREFILL_PROBE; do [ -f "$SHM/device_bench-$p/config.json" ] && order=("$p" "${order[@]}") || order+=("$p"); done
      for p in "${order[@]}"; do
        ensure_probe "$p" $(probe_args "$p") || continue
        for n in "${NAMES[@]}"; do
          f=$W/prefill-$p-$n
          x "${BIN[$n]}" bench prefill --model "$DIR" --prompt "$PROMPTS" --repeat 2 --json ${PREFILL_TILES:+--tiles "$PREFILL_TILES"} > "$f.json" 2> "$f.txt" \
            || { echo "bench prefill ($p, $n) failed: rc $?"; cat "$f.txt"; continue; }
          [ "$DRY" = 0 ] && cat "$f.txt"
          sum prefill "$f.json" "$p $n (decode tok/s on this probe: ${DECODE_TOK[$p $n]:-not measured})"
        done
        x rm -rf "$DIR"
      done ;;
    stream)
      ids=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16; total=$((STREAM_LAYERS * 256))
      for fmt in $STREAM_FORMATS; do
        ensure_probe "stream-$fmt" --preset inkling-small --layers "$STREAM_LAYERS" --experts "$fmt" || continue
        for n in "${NAMES[@]}"; do
          f=$W/stream-$fmt-$n.tsv; [ "$DRY" = 0 ] && : > "$f"
          budgets="100%:$total 50%:$((total / 2)) 25%:$((total / 4))"
          [ "${STREAM_COLD:-0}" = 1 ] && budgets="$budgets 25%-cold:$((total / 4))"
          for b in $budgets; do
            tag=${b%%:*}; slots=${b#*:}
            if [[ $tag == *cold ]] && [ "$DRY" = 0 ]; then
              python3 -c "
import os, sys
for f in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], f), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$DIR"
            fi
            if [ "$DRY" = 1 ]; then
              x "${BIN[$n]}" generate --model "$DIR" --prompt-ids "$ids" --max-tokens 32 --temperature 0 --json --expert-slots "$slots" --usage-file off
            else
              doc=$("${BIN[$n]}" generate --model "$DIR" --prompt-ids "$ids" --max-tokens 32 --temperature 0 --json \
                --expert-slots "$slots" --usage-file off 2>> "$W/stream-$fmt-$n.txt" | tr -d '\n')
              printf '%s\t%s\n' "$tag" "$doc" >> "$f"
            fi
          done
          sum stream "$f" "$fmt $STREAM_LAYERS layers $n"
        done
        x rm -rf "$DIR"
      done ;;
    generate)
      ids=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
      for fmt in $GEN_FORMATS; do
        # the stream step's container (the same synth arguments), reused when it is there
        ensure_probe "stream-$fmt" --preset inkling-small --layers "$STREAM_LAYERS" --experts "$fmt" || continue
        for n in "${NAMES[@]}"; do
          f=$W/generate-$fmt-$n
          if x "${BIN[$n]}" bench decode --model "$DIR" --tokens 64 --json --peak-gbs "$peak" > "$f-decode.json" 2> "$f-decode.txt"; then
            sum decode "$f-decode.json" "generate-container $fmt $n"
          else
            echo "bench decode (generate $fmt, $n) failed: rc $?"; cat "$f-decode.txt"
          fi
          [ "$DRY" = 0 ] && : > "$f.tsv"
          for k in $GEN_TOKENS; do
            if [ "$DRY" = 1 ]; then
              x "${BIN[$n]}" generate --model "$DIR" --prompt-ids "$ids" --max-tokens "$k" --temperature 0 --json --usage-file off
            else
              printf '%s\t%s\n' "$k tokens" "$("${BIN[$n]}" generate --model "$DIR" --prompt-ids "$ids" --max-tokens "$k" \
                --temperature 0 --json --usage-file off 2>> "$f.txt" | tr -d '\n')" >> "$f.tsv"
            fi
          done
          sum generate "$f.tsv" "$fmt $STREAM_LAYERS layers $n"
        done
        x rm -rf "$DIR"
      done ;;
    batch)
      conts=$PROBES; [ "$BATCH_FULL" = 1 ] && conts="$conts full"
      maxb=$(echo "$BATCHES" | tr , '\n' | sort -n | tail -1)
      for p in $conts; do
        if [ "$p" = full ]; then
          tag=full-int4-g64-$STREAM_LAYERS
          ensure_probe "stream-int4-g64" --preset inkling-small --layers "$STREAM_LAYERS" --experts int4-g64 || continue
        else
          tag=$p; ensure_probe "$p" $(probe_args "$p") || continue
        fi
        for n in "${NAMES[@]}"; do
          f=$W/batch-$tag-$n
          x "${BIN[$n]}" bench batch --model "$DIR" --batch "$BATCHES" --tokens "$TOKENS" --json > "$f.json" 2> "$f.txt" \
            || { echo "bench batch ($tag, $n) failed: rc $?"; cat "$f.txt"; }
          [ "$DRY" = 0 ] && { cat "$f.txt"; sum batch "$f.json" "$tag $n"; }
          if [ "$p" = full ]; then
            x "${BIN[$n]}" bench batch --model "$DIR" --batch "$BATCHES" --tokens 16 --expert-slots $((STREAM_LAYERS * 256 - 1)) \
              --json > "$f-streamed.json" 2> "$f-streamed.txt" || { echo "bench batch streamed failed: rc $?"; cat "$f-streamed.txt"; }
            [ "$DRY" = 0 ] && { cat "$f-streamed.txt"; sum batch "$f-streamed.json" "$tag $n, experts streamed through all slots but one"; }
          fi
          port=18080
          if [ "$DRY" = 1 ]; then
            x "${BIN[$n]}" serve --model "$DIR" --port $port --parallel "$maxb" --ctx 2048 --model-id probe
          else
            "${BIN[$n]}" serve --model "$DIR" --port $port --parallel "$maxb" --ctx 2048 --model-id probe > "$f-serve.log" 2>&1 &
            pid=$!
            for _ in $(seq 600); do
              python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break
              kill -0 $pid 2>/dev/null || break; sleep 0.5
            done
          fi
          x python3 benches/serve_bench.py --url "http://127.0.0.1:$port" --model probe --tokens "$SERVE_TOKENS" \
            --concurrency "$BATCHES" --endpoint completions --logprobs --prompt "Once upon a time there was" > "$f-serve.json" 2> "$f-serve-bench.txt" \
            || { echo "serve_bench ($tag, $n) failed: rc $?"; cat "$f-serve-bench.txt" "$f-serve.log"; }
          if [ "$DRY" = 0 ]; then
            kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null
            cat "$f-serve.log"; cat "$f-serve.json"; sum serve "$f-serve.json" "$tag $n"
          fi
        done
      done ;;
    model-peer)
      if [ -f "$MODEL_PEER/run.sh" ] || [ "$DRY" = 1 ]; then
        OUT=$W/model-peer x bash "$MODEL_PEER/run.sh" "${MODEL_PEER_WHICH:-small}" > "$W/model-peer.txt" 2>&1 || echo "model peer failed: rc $?"
        [ "$DRY" = 0 ] && { tail -40 "$W/model-peer.txt"; grep -h RESULT "$W/model-peer.txt" | sed 's/^/summary: model-peer: /' | tee -a "$SUMMARY"; }
      else
        echo "no model peer at $MODEL_PEER (copy ../shared/peers/llamacpp-model into .dev/peer-model and carry .dev)"
      fi ;;
  esac
done
echo "=== summary"; [ "$DRY" = 0 ] && cat "$SUMMARY"
exit 0
