#!/usr/bin/env python3
"""Train the demo Inkling (`models/austen-demo`) on the Austen corpus: an `InklingForCausalLM` of
transformers 5.24.0, from scratch, with a fixed seed.

    python3 tools/train_demo_model.py --data TOKDIR --out OUTDIR [--seconds 270] [--seed 0]

TOKDIR is the output of tools/demo_tokenizer.py (train.u16, valid.u16, test.u16). OUTDIR gets the
best checkpoint by validation loss (`save_pretrained`, float32, `model-*.safetensors`) and
`train_log.json` (arguments, seed, sha256 of the data, losses). The demo model was trained on the
device tool's NVIDIA H200 (torch 2.11, bf16 autocast, float32 master weights), see
models/austen-demo/README.md for the exact command and figures; the same command runs on a CPU
(slowly; `--steps N` bounds it).

Training: random windows of `--ctx` tokens of the training split (documents are chapters, each
ending with <|endoftext|>, packed without masking across them), next-token cross-entropy, AdamW
(β = 0.9/0.95, weight decay on matrices only), linear warm-up then cosine decay to 10 %. Routed
experts are balanced without an auxiliary loss, as DeepSeek-V3 does (arXiv:2412.19437, §2.1.2):
after each step each sparse layer's `e_score_correction_bias` moves by `BIAS_RATE` towards the
mean load (+ for under-loaded experts, − for over-loaded ones). That bias only chooses experts, it
never weighs them, so it is part of the model (the engine reads it like any checkpoint's).
"""

import argparse
import hashlib
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import transformers
from transformers import InklingForCausalLM, InklingTextConfig

EOT = 0  # <|endoftext|> (tools/demo_tokenizer.py)
END_SAMPLING = 8  # <|content_model_end_sampling|>
BIAS_RATE = 1e-3

# Every Inkling feature the engine implements: sliding (window 64) and global layers, relative
# position bias (global extent 256, sliding = window), τ scaling on the global layers from
# position 64, short convolutions, one dense layer before three sparse ones, 8 routed experts
# with top-2 and one shared expert, a different head shape on the sliding layers.
CONFIG = dict(
    vocab_size=4096,
    hidden_size=256,
    num_hidden_layers=4,
    layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    swa_num_attention_heads=8,
    swa_num_key_value_heads=2,
    swa_head_dim=32,
    sliding_window_size=64,
    d_rel=8,
    rel_extent=256,
    log_scaling_n_floor=64,
    log_scaling_alpha=0.1,
    conv_kernel_size=4,
    intermediate_size=512,
    moe_intermediate_size=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    route_scale=2.5,
    logits_mup_width_multiplier=4.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    initializer_range=0.02,
    bos_token_id=None,
    eos_token_id=EOT,  # generation_config.json lists both EOS ids
    pad_token_id=None,
)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def load_ids(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def build_model():
    cfg = InklingTextConfig(**CONFIG)
    cfg._attn_implementation = "eager"
    return InklingForCausalLM(cfg)


@torch.no_grad()
def eval_loss(model, ids, ctx, device, dtype):
    """Mean next-token loss over non-overlapping windows of `ctx` tokens covering `ids`."""
    model.eval()
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        x = ids[s : s + ctx + 1].to(device)
        if len(x) < 2:
            break
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=x[None, :-1], use_cache=False).logits.float()
        total += F.cross_entropy(logits[0], x[1:], reduction="sum").item()
        n += len(x) - 1
    model.train()
    return total / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=270.0, help="wall-clock budget of the training loop")
    ap.add_argument("--steps", type=int, default=2000, help="optimizer steps (the cosine schedule's length)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json, to print greedy samples at the end")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--init", default=None,
                    help="start from this checkpoint directory (from_pretrained) instead of random weights")
    ap.add_argument("--keep-last", action="store_true",
                    help="keep the last step's weights, not the best by validation loss (fine-tuning)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--conv-frac", type=float, default=0.0,
                    help="fraction of each batch's windows taken from conv_train.u16 (tools/austen_conversations.py)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    files = {s: os.path.join(args.data, f"{s}.u16") for s in ("train", "valid", "test")}
    data = {s: load_ids(p) for s, p in files.items()}
    train = data["train"]
    conv = None
    if args.conv_frac > 0:
        files["conv_train"] = os.path.join(args.data, "conv_train.u16")
        conv = data["conv_train"] = load_ids(files["conv_train"])

    if args.init:
        model = InklingForCausalLM.from_pretrained(args.init, dtype=torch.float32, attn_implementation="eager")
    else:
        model = build_model()
    model = model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "rel_logits_proj" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "rel_logits_proj" not in n)]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=args.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    # the schedule's length: --steps, or fewer where the first 50 steps' rate says that --seconds
    # cannot hold them (then recorded as `steps` in train_log.json, to rerun with --steps)
    sched = dict(steps=args.steps)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = min(1.0, (step - args.warmup) / max(1, sched["steps"] - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    # expert loads of each sparse layer, gathered by a hook on its router
    routers = [l.mlp.gate for l in model.model.layers if hasattr(l.mlp, "gate")]
    loads = {}

    def hook(mod, _inp, out):
        loads[mod] = torch.bincount(out[2].reshape(-1), minlength=mod.num_experts).float()

    for r in routers:
        r.register_forward_hook(hook)

    g = torch.Generator().manual_seed(args.seed)
    log = dict(
        args=vars(args),
        transformers=transformers.__version__,
        torch=torch.__version__,
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        params=n_params,
        data_sha256={s: sha256(p) for s, p in files.items()},
        data_tokens={s: len(v) for s, v in data.items()},
        evals=[],
    )
    print(json.dumps({k: log[k] for k in ("params", "data_tokens", "device")}), flush=True)
    best = (float("inf"), None, -1)
    t0 = time.time()
    step = 0
    while step < sched["steps"] and time.time() - t0 < args.seconds:
        if step == 50:
            rate = 50 / (time.time() - t0)
            sched["steps"] = min(args.steps, int(50 + rate * (args.seconds - (time.time() - t0)) * 0.95))
            print(json.dumps(dict(steps_per_second=round(rate, 2), schedule_steps=sched["steps"])), flush=True)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        n_conv = int(round(args.batch * args.conv_frac))
        starts = torch.randint(0, len(train) - args.ctx - 1, (args.batch - n_conv,), generator=g)
        rows = [train[s : s + args.ctx + 1] for s in starts.tolist()]
        if n_conv:
            starts = torch.randint(0, len(conv) - args.ctx - 1, (n_conv,), generator=g)
            rows += [conv[s : s + args.ctx + 1] for s in starts.tolist()]
        x = torch.stack(rows).to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for r in routers:
                ld = loads[r]
                r.e_score_correction_bias += BIAS_RATE * torch.sign(ld.mean() - ld)
        step += 1
        if step % args.eval_every == 0 or step == 1:
            v = eval_loss(model, data["valid"], args.ctx, device, dtype)
            imb = max(float(loads[r].max() / loads[r].mean()) for r in routers)
            e = dict(step=step, seconds=round(time.time() - t0, 1), train_loss=round(loss.item(), 4),
                     valid_loss=round(v, 4), max_expert_load_over_mean=round(imb, 3), lr=lr_at(step))
            log["evals"].append(e)
            print(json.dumps(e), flush=True)
            if v < best[0]:
                best = (v, {k: t.detach().cpu().clone() for k, t in model.state_dict().items()}, step)
    v = eval_loss(model, data["valid"], args.ctx, device, dtype)
    if v < best[0] or args.keep_last:
        best = (v, {k: t.detach().cpu().clone() for k, t in model.state_dict().items()}, step)
    model.load_state_dict(best[1])
    model = model.float().eval()
    log["steps"] = step
    log["best_step"] = best[2]
    log["valid_loss"] = eval_loss(model, data["valid"], args.ctx, device, torch.float32)
    log["test_loss"] = eval_loss(model, data["test"], args.ctx, device, torch.float32)
    if os.path.exists(os.path.join(args.data, "conv_valid.u16")):
        log["conv_valid_loss"] = eval_loss(model, load_ids(os.path.join(args.data, "conv_valid.u16")), args.ctx, device, torch.float32)
    log["seconds"] = round(time.time() - t0, 1)
    if args.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(args.tokenizer)
        log["samples"] = {}
        for prompt in ["Once upon a time", "It is a truth universally acknowledged", "Emma"]:
            ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device=device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=60,
                                 do_sample=False, eos_token_id=[EOT, END_SAMPLING], pad_token_id=EOT)
            log["samples"][prompt] = tok.decode(out[0].tolist(), skip_special_tokens=False)
    print(json.dumps({k: log.get(k) for k in ("steps", "best_step", "valid_loss", "test_loss", "conv_valid_loss", "seconds", "samples")}),
          flush=True)
    model = model.cpu()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, max_shard_size="12MB")
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
