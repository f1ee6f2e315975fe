#!/usr/bin/env python3
"""Build the bundled demo model `tests/fixtures/austen-demo` from the trained checkpoint, and its
transformers references.

    python3 tools/austen_corpus.py --deb r-cran-janeaustenr_1.0.0-1_all.deb --out CORPUS
    python3 tools/demo_tokenizer.py --corpus CORPUS --out TOKDIR
    python3 tools/train_demo_model.py --data TOKDIR --out TRAINED ...    (on a GPU: see its docstring)
    cargo build --release
    python3 tools/make_demo_model.py --trained TRAINED --tokenizer TOKDIR --corpus CORPUS

Steps:
1. The trained float32 checkpoint is loaded by transformers as bfloat16 and saved again (a BF16
   source; transformers keeps the convolutions, the router's bias and its global scale in F32).
2. `inkling-wgpu convert` turns it into a stamped container with the defaults: routed experts
   int4-g64, shared experts, attention and dense MLP bf16, head as the source (bf16), embedding,
   norms, convolutions and router copied. That container is the shipped model.
3. The container is decoded exactly as FORMATS.md says (int4-g64: w = (nibble − 8)·s, bf16: the
   upper half of an f32) into float32 tensors under transformers' names, and loaded into an
   `InklingForCausalLM` (float32, eager attention). Every reference comes from that model, so it
   runs on exactly the values the engine runs.
4. References (tools/make_tiny_inkling.py's `greedy`, `teacher_forced`, `margins`, `roundtrip`):
   three greedy cases with the model's own EOS ids (one that ends on `<|endoftext|>`: the end of a
   training chapter, where the model's next token is that EOS; one of
   `MAX_NEW` tokens after a held-out prompt that runs past the sliding window and τ's floor, and
   the README prompt), teacher-forced logits at `LOGIT_ROWS` positions of each case (whole rows of
   4096 would make the fixture megabytes), the held-out test text and its token ids (the Rust
   tokenizer must give the same ids and decode it back).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

import transformers
from transformers import InklingForCausalLM, InklingTextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_inkling import greedy, margins, roundtrip, teacher_forced  # noqa: E402
from demo_tokenizer import END_SAMPLING, EOT  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DST = os.path.join(ROOT, "tests", "fixtures", "austen-demo")
MAX_NEW = 48
EOS_IDS = [EOT, END_SAMPLING]
README_PROMPT = "Once upon a time"
MIN_MARGIN = 0.01
EOS_CONTEXT = 96  # prompt tokens of the EOS case  # smallest top-1 margin (logits) accepted along a reference continuation
# teacher-forced rows kept per case: the first ones, both sides of the sliding window (64) and of
# τ's floor (position 64, so row 63 is the last unscaled query), and the last ones
LOGIT_ROWS = [0, 1, 2, 31, 62, 63, 64, 65, 66, 90, -2, -1]
SHIPPED = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"]


def generation_config():
    return dict(
        _from_model_config=False,
        eos_token_id=EOS_IDS,
        pad_token_id=EOT,
        # sampled by default, as a small chat model's card would say (greedy decoding of a model
        # this small falls into loops); the references are greedy whatever this says
        do_sample=True,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        max_new_tokens=64,
        transformers_version=transformers.__version__,
    )


def bf16_source(trained, tokdir, out):
    m = InklingForCausalLM.from_pretrained(trained, dtype=torch.bfloat16, attn_implementation="eager")
    m.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config(), f, indent=2)
        f.write("\n")


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def decode_int4_grouped(blob: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """FORMATS.md int4 / int4-grouped: column 2j in the low nibble of byte j, 2j+1 in the high one,
    w = (nibble − 8)·s[o][i / gs], gs the group size whose count matches the scales."""
    rows = blob.shape[0]
    q = np.empty((rows, blob.shape[1] * 2), dtype=np.int32)
    q[:, 0::2] = blob & 0x0F
    q[:, 1::2] = blob >> 4
    q = q[:, :cols] - 8
    groups = scales.shape[1]
    gs = next(g for g in (32, 64, 128, cols) if -(-cols // g) == groups)  # smallest that matches
    s = np.repeat(scales.astype(np.float32), gs, axis=1)[:, :cols]
    return (q.astype(np.float32) * s).astype(np.float32)


def dequantised_state_dict(container_dir, cfg):
    """Every tensor of the container as float32, under InklingForCausalLM's names (routed experts
    stacked as `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], shared ones as [S, …])."""
    path = os.path.join(container_dir, "model.safetensors")
    flat = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        fmt = json.loads(meta["inkling.fmt"])
        shape = json.loads(meta.get("inkling.shape", "{}"))
        for name in f.keys():
            if name.endswith(".qs") or name.startswith("__pad__"):  # scales; alignment padding
                continue
            t = f.get_tensor(name)
            kind = fmt.get(name)
            if kind in ("int4", "int4-grouped"):
                qs = f.get_tensor(name + ".qs").numpy()
                flat[name] = decode_int4_grouped(t.numpy(), qs, shape[name][1])
            elif kind is not None and kind not in ("bf16", "f32"):
                raise SystemExit(f"{path}: {name}: format {kind} is not decoded here")
            elif t.dtype == torch.bfloat16:
                flat[name] = bf16_to_f32(t.view(torch.int16).numpy().view(np.uint16))
            elif t.dtype == torch.float32:
                flat[name] = t.numpy()
            else:
                raise SystemExit(f"{path}: {name}: unexpected dtype {t.dtype}")
    sd = {}
    for name, t in flat.items():
        if ".mlp.experts." in name or ".mlp.shared_experts." in name:
            continue
        sd[name] = torch.from_numpy(np.ascontiguousarray(t))
    for i, kind in enumerate(cfg.mlp_layer_types):
        if kind != "sparse":
            continue
        p = f"model.layers.{i}.mlp"
        e = lambda x, w: flat[f"{p}.experts.{x}.{w}_proj.weight"]
        sd[f"{p}.experts.gate_up_proj"] = torch.from_numpy(
            np.stack([np.concatenate([e(x, "gate"), e(x, "up")]) for x in range(cfg.n_routed_experts)])
        )
        sd[f"{p}.experts.down_proj"] = torch.from_numpy(np.stack([e(x, "down") for x in range(cfg.n_routed_experts)]))
        for w in ("gate", "up", "down"):
            sd[f"{p}.shared_experts.{w}_proj"] = torch.from_numpy(
                np.stack([flat[f"{p}.shared_experts.{x}.{w}_proj.weight"] for x in range(cfg.n_shared_experts)])
            )
    return sd


def load_dequantised(container_dir):
    cfg = InklingTextConfig.from_pretrained(container_dir)
    cfg._attn_implementation = "eager"
    model = InklingForCausalLM(cfg).float()
    sd = dequantised_state_dict(container_dir, cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"container → transformers: missing {missing}, unexpected {unexpected}")
    return model.eval()


def case(model, tok, prompt_text, key, prompt=None):
    """Greedy continuation with the model's EOS ids, its teacher-forced logits at LOGIT_ROWS and the
    smallest top-1 margin along the continuation; None when cached and uncached argmax disagree.
    `prompt` (ids) overrides the encoding of `prompt_text`."""
    if prompt is None:
        prompt = tok.encode(prompt_text, add_special_tokens=False).ids
    gen = greedy(model, prompt, eos=EOS_IDS, max_new=MAX_NEW, pad=EOT, bos=None)
    fin = "eos" if gen[-1] in EOS_IDS else "length"
    seq = prompt + gen
    logits = teacher_forced(model, seq)[:-1]
    if logits[len(prompt) - 1 :].argmax(-1).tolist() != gen:
        return None
    rows = sorted({r % len(logits) for r in LOGIT_ROWS})
    return dict(
        prompt_text=prompt_text,
        prompt_ids=prompt,
        generated_ids=gen,
        generated_text=tok.decode(gen, skip_special_tokens=True),
        finish_reason=fin,
        max_new_tokens=MAX_NEW,
        min_top1_margin=float(margins(logits[len(prompt) - 1 :]).min()),
        logits_key=key,
        logits_positions=rows,
        _logits=logits[rows].contiguous(),
    )


@torch.no_grad()
def chapter_endings(model, tokdir, n=EOS_CONTEXT):
    """Prompt candidates for the EOS case: the `n` training tokens before each <|endoftext|> where
    the model's teacher-forced argmax is <|endoftext|> (a tiny model rarely knows that a chapter
    ends, so these cases continue with the EOS alone)."""
    ids = np.fromfile(os.path.join(tokdir, "train.u16"), dtype="<u2").astype(np.int64)
    rows = [ids[p - n : p + 1] for p in np.nonzero(ids == EOT)[0] if p >= n]
    out = []
    for b in range(0, len(rows), 32):
        x = torch.tensor(np.stack(rows[b : b + 32]))
        last = model(input_ids=x[:, :-1], use_cache=False).logits[:, -1].argmax(-1)
        out += [x[i, :-1].tolist() for i in range(len(x)) if int(last[i]) == EOT]
    return out


def heldout_prompts(corpus):
    """Prompt candidates for the length case: ~330 characters (about 80 tokens, cut at a word) of
    the held-out text (Persuasion, chapters 21–24) from the start of successive paragraphs."""
    text = open(os.path.join(corpus, "test.txt"), encoding="utf-8").read()
    starts = [0] + [i + 2 for i in range(len(text)) if text.startswith("\n\n", i)]
    return [" ".join(text[s : s + 330].split(" ")[:-1]) for s in starts if len(text) - s > 400]


@torch.no_grad()
def mean_loss(model, ids, ctx=512):
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        x = torch.tensor(ids[s : s + ctx + 1])
        logits = model(input_ids=x[None, :-1], use_cache=False).logits[0].float()
        total += torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum").item()
        n += len(x) - 1
    return total / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trained", required=True, help="tools/train_demo_model.py output (float32)")
    ap.add_argument("--tokenizer", required=True, help="tools/demo_tokenizer.py output")
    ap.add_argument("--corpus", required=True, help="tools/austen_corpus.py output")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "inkling-wgpu"))
    ap.add_argument("--bf16-out", default=None, help="also keep the BF16 source checkpoint here")
    ap.add_argument("--eval", action="store_true", help="held-out loss of float32, BF16 and the container")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))

    with tempfile.TemporaryDirectory() as tmp:
        src, conv = os.path.join(tmp, "bf16"), os.path.join(tmp, "container")
        bf16_source(args.trained, args.tokenizer, src)
        if args.bf16_out:
            shutil.copytree(src, args.bf16_out, dirs_exist_ok=True)
        subprocess.run([args.bin, "convert", "--model", src, "--out", conv], check=True)
        model = load_dequantised(conv)

        cases = []
        for p in chapter_endings(model, args.tokenizer):
            c = case(model, tok, tok.decode(p, skip_special_tokens=False), "case0", prompt=p)
            if c and c["finish_reason"] == "eos" and c["min_top1_margin"] >= MIN_MARGIN:
                cases.append(c)
                break
        else:
            raise SystemExit("no chapter ending whose greedy continuation ends on <|endoftext|>")
        for p in heldout_prompts(args.corpus)[:12]:
            c = case(model, tok, p, "case1")
            if c and c["finish_reason"] == "length" and c["min_top1_margin"] >= MIN_MARGIN:
                cases.append(c)
                break
            print(f"case1 candidate rejected: {c and c['min_top1_margin']}", flush=True)
        else:
            raise SystemExit("no held-out prompt with a clear greedy continuation")
        c = case(model, tok, README_PROMPT, "case2")
        if c is None or c["min_top1_margin"] < MIN_MARGIN:
            raise SystemExit(f"case2 ({README_PROMPT!r}): unusable reference ({c and c['min_top1_margin']})")
        cases.append(c)
        assert cases[1]["finish_reason"] == "length"
        assert len(cases[1]["prompt_ids"]) + MAX_NEW > 66, "case1 must pass the window and tau's floor"

        losses = {}
        if args.eval:
            test_ids = np.fromfile(os.path.join(args.tokenizer, "test.u16"), dtype="<u2").tolist()
            for name, m in [
                ("f32", InklingForCausalLM.from_pretrained(args.trained, dtype=torch.float32, attn_implementation="eager")),
                ("bf16", InklingForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager")),
                ("container", model),
            ]:
                losses[name] = mean_loss(m.eval(), test_ids)
                print(f"held-out loss {name}: {losses[name]:.4f} (perplexity {np.exp(losses[name]):.2f})")

        os.makedirs(DST, exist_ok=True)  # its README.md (the model card) is kept
        for f in SHIPPED:
            shutil.copy(os.path.join(conv, f), os.path.join(DST, f))

    save_file({c["logits_key"]: c.pop("_logits") for c in cases}, os.path.join(DST, "reference.safetensors"))
    test_text = open(os.path.join(args.corpus, "test.txt"), encoding="utf-8").read()
    with open(os.path.join(DST, "heldout-test.txt"), "w", encoding="utf-8") as f:
        f.write(test_text)
    test_ids = np.asarray(tok.encode(test_text, add_special_tokens=False).ids, dtype="<u2")
    assert tok.decode(test_ids.tolist(), skip_special_tokens=False) == test_text
    test_ids.tofile(os.path.join(DST, "heldout-test.u16"))
    rt_texts = [
        "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
        "\"Oh!  Mr. Knightley,\" cried Emma; \"£20,000 — naïve café.\"\n\nCHAPTER IV\n",
        "<|message_user|><|content_text|>Hello<|end_message|><|message_model|>",
        "  two  spaces\tand tab ✓",
    ]
    reference = dict(
        fixture="austen-demo",
        layout="causal",
        weights_dtype="int4-g64 experts, bf16 rest (container)",
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        compute_dtype="float32",
        attn_implementation="eager",
        eos_token_id=EOS_IDS,
        vocab_size=model.config.vocab_size,
        unpadded_vocab_size=model.config.unpadded_vocab_size,
        logits_width=model.config.vocab_size,
        min_top1_margin=min(c["min_top1_margin"] for c in cases),
        heldout_loss=losses or None,
        heldout_sha256=hashlib.sha256(test_text.encode()).hexdigest(),
        cases=cases,
        tokenizer_roundtrip=roundtrip(tok, rt_texts),
    )
    with open(os.path.join(DST, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for c in cases:
        print(f"{c['logits_key']} {c['finish_reason']} margin {c['min_top1_margin']:.3f}: "
              f"{c['prompt_text'][-60:]!r} → {c['generated_text']!r}")


if __name__ == "__main__":
    main()
