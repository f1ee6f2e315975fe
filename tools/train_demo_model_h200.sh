#!/usr/bin/env bash
# Device-side driver of tools/train_demo_model.py, as run for models/austen-demo on the device tool's
# NVIDIA H200: three learning-rate/batch variants of the same model and seed in parallel on one GPU;
# the one with the lowest validation loss comes back in $OUT. Run from a folder holding this script,
# train_demo_model.py, tools/demo_tokenizer.py's train/valid/test.u16 and tokenizer.json, and the
# transformers-5.24.0-py3-none-any.whl wheel (the machine's own transformers is older):
#   SECONDS_BUDGET=300 bash train_demo_model_h200.sh
# Variant A won (validation loss 4.136 at its step 500 of 600); alone it is
#   python3 train_demo_model.py --data . --out OUT --seed 0 --lr 3e-3 --steps 600 --batch 32
set -u
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site transformers-5.24.0-py3-none-any.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import transformers,torch;print(transformers.__version__,torch.__version__,torch.cuda.get_device_name())" || exit 1
sha256sum train.u16 valid.u16 test.u16 tokenizer.json train_demo_model.py
S=${SECONDS_BUDGET:-360}
python3 train_demo_model.py --data . --out /tmp/run_A --tokenizer tokenizer.json --seed 0 --seconds $S --lr 3e-3 --steps 600 --batch 32 > /tmp/log_A 2>&1 &
python3 train_demo_model.py --data . --out /tmp/run_B --tokenizer tokenizer.json --seed 0 --seconds $S --lr 3e-3 --steps 450 --batch 64 > /tmp/log_B 2>&1 &
python3 train_demo_model.py --data . --out /tmp/run_C --tokenizer tokenizer.json --seed 0 --seconds $S --lr 2e-3 --steps 800 --batch 32 --weight-decay 0.3 > /tmp/log_C 2>&1 &
wait
for v in A B C; do echo "=== $v"; grep -v Warning /tmp/log_$v | tail -40; done | tee $OUT/logs.txt
python3 - <<'PY'
import json, os, shutil
res = []
for v in "ABC":
    p = f"/tmp/run_{v}/train_log.json"
    if os.path.exists(p):
        res.append((json.load(open(p))["valid_loss"], v))
print("valid losses", sorted(res))
best = min(res)[1]
print("best", best)
for f in os.listdir(f"/tmp/run_{best}"):
    shutil.copy(f"/tmp/run_{best}/{f}", os.environ["OUT"])
PY
ls -la $OUT
