#!/usr/bin/env bash
# Expert streaming on the device (BENCHMARKS.md#streaming), one device call with carry [".gl", ".dev"]:
#   bash tools/device_stream.sh
# .dev/base.gz and .dev/new.gz are gzipped release binaries (base optional). For each format of FMTS
# (int4-g64 int3-g64): an 8-layer `synth --preset inkling-small` with all 256 routed experts per layer
# into /dev/shm; `generate --expert-slots 1024|512` (16 prompt ids, 32 greedy tokens) with base and new
# side by side; then new's `bench stream` at 100%, 75%, 50%, 25% and 12.5% of the routed experts.
# COLD=1 (default) adds an int4-g64 container on the disk and `bench stream --cold` at 50% and 25%.
# Every output comes back in $OUT/s1.tgz.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json WGPU_BACKEND=vulkan NODEVICE_SELECT=1
mkdir -p /tmp/b; for n in base new; do [ -f .dev/$n.gz ] && gunzip -c .dev/$n.gz > /tmp/b/$n && chmod +x /tmp/b/$n; done
W=/tmp/w; mkdir -p $W
ids=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
nproc; free -g | head -2; df -h /dev/shm | tail -1
for fmt in ${FMTS:-int4-g64 int3-g64}; do
  D=/dev/shm/s-$fmt
  t0=$(date +%s); /tmp/b/new synth --preset inkling-small --layers 8 --experts $fmt --out $D > $W/synth-$fmt.txt 2>&1 || { echo synth failed; cat $W/synth-$fmt.txt; }
  echo "synth $fmt $(( $(date +%s) - t0 )) s; $(du -sh $D | cut -f1)"
  for slots in 1024 512; do
    for n in base new; do
      [ -x /tmp/b/$n ] || continue
      timeout 120 /tmp/b/$n generate --model $D --prompt-ids $ids --max-tokens 32 --temperature 0 --json --expert-slots $slots --usage-file off > $W/gen-$fmt-$slots-$n.json 2> $W/gen-$fmt-$slots-$n.txt
      python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); s=d['stats']; x=s['experts']
print('GEN', sys.argv[2], 'decode %.1f tok/s'%s['decode_tok_s'], 'hit', x.get('hit_rate'), 'copy %.2f GB/s'%x.get('upload_gbs',0), 'upload_s %.3f'%x.get('upload_s',0), 'routing %.3f'%x.get('routing_wait_s',0), 'pipelines', s.get('pipelines_built'), 'ids', hash(tuple(d['generated_ids'])))" $W/gen-$fmt-$slots-$n.json "$fmt $slots $n" || tail -3 $W/gen-$fmt-$slots-$n.txt
    done
  done
  timeout 200 /tmp/b/new bench stream --model $D --slots 100%,75%,50%,25%,12.5% > $W/bs-$fmt.txt 2>&1; cat $W/bs-$fmt.txt
  rm -rf $D
done
if [ "${COLD:-1}" = 1 ]; then
  # cold: a container on the disk, pages dropped
  D=/tmp/s-cold; t0=$(date +%s)
  /tmp/b/new synth --preset inkling-small --layers 8 --experts int4-g64 --out $D > $W/synth-cold.txt 2>&1
  echo "synth (disk) $(( $(date +%s) - t0 )) s"
  timeout 150 /tmp/b/new bench stream --model $D --slots 50%,25% --tokens 12 --cold > $W/bs-cold.txt 2>&1; cat $W/bs-cold.txt
  rm -rf $D
fi
tar czf $OUT/s1.tgz -C /tmp w
