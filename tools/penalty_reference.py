"""transformers' repetition penalty on the tiny-causal-f32 fixture: the reference of
tests/suite/model/model_generation_config.rs.

For each prompt of the fixture's reference.json and each penalty, greedy `generate` (do_sample=False,
the fixture's EOS ids, 16 new tokens) with `repetition_penalty` set in the GenerationConfig, as a
generation_config.json that sets it would: transformers 5.24.0 applies
`RepetitionPenaltyLogitsProcessor` over the whole sequence (prompt and generated ids; an unpadded
prompt ignores nothing), greedy or sampled. Writes
tests/fixtures/tiny-causal-f32/penalty_reference.json: per case the ids, and the smallest top-1
margin of the processed scores over the run (how far each greedy choice is from a tie). One more
case has a prompt of over 64 ids (two of the fixture's prompts, then one of them four times more),
and beside its ids those of the same penalty over the last 64 ids only (llama.cpp's default window,
a custom processor here), which differ: the whole-sequence window is what this case tests.

Usage (the versions of tools/requirements.txt): python tools/penalty_reference.py
"""
import json
import os

import torch
import transformers
from transformers import GenerationConfig, InklingForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures", "tiny-causal-f32")
PENALTIES = [1.3, 0.8]
MAX_NEW = 16


class LastN(transformers.LogitsProcessor):
    """The repeat penalty over the distinct ids of the last `n` ids (llama.cpp's window)."""

    def __init__(self, penalty, n):
        self.penalty, self.n = penalty, n

    def __call__(self, input_ids, scores):
        ids = input_ids[:, -self.n:]
        s = torch.gather(scores, 1, ids)
        s = torch.where(s < 0, s * self.penalty, s / self.penalty)
        return scores.scatter(1, ids, s)


@torch.no_grad()
def run(model, prompt, eos, penalty, last_n=None):
    ids = torch.tensor([prompt])
    gc = GenerationConfig(
        do_sample=False,
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
        pad_token_id=0,
        bos_token_id=1,
        repetition_penalty=penalty if last_n is None else None,
    )
    extra = {} if last_n is None else dict(logits_processor=[LastN(penalty, last_n)])
    out = model.generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids),
                         output_scores=True, return_dict_in_generate=True, **extra)
    gen = out.sequences[0, len(prompt):].tolist()
    margin = min(float((s[0].topk(2).values[0] - s[0].topk(2).values[1])) for s in out.scores)
    return gen, margin


def main():
    ref = json.load(open(os.path.join(FIX, "reference.json")))
    model = InklingForCausalLM.from_pretrained(FIX, dtype=torch.float32, attn_implementation="eager").eval()
    eos = ref["eos_token_id"]
    cases = []
    for c in ref["cases"]:
        plain, _ = run(model, c["prompt_ids"], eos, 1.0)
        for r in PENALTIES:
            gen, margin = run(model, c["prompt_ids"], eos, r)
            cases.append(dict(prompt_ids=c["prompt_ids"], repetition_penalty=r, generated_ids=gen,
                              unpenalized_ids=plain, min_top1_margin=margin))
            print(f"penalty {r}: {gen} (without: {plain}), margin {margin:.4g}")
    long = ref["cases"][1]["prompt_ids"] + ref["cases"][0]["prompt_ids"] * 5
    assert len(long) > 64
    for r in PENALTIES:
        gen, margin = run(model, long, eos, r)
        last64, _ = run(model, long, eos, r, last_n=64)
        plain, _ = run(model, long, eos, 1.0)
        cases.append(dict(prompt_ids=long, repetition_penalty=r, generated_ids=gen, unpenalized_ids=plain,
                          last64_ids=last64, min_top1_margin=margin))
        print(f"long prompt ({len(long)} ids), penalty {r}: {gen} (last 64 only: {last64}), margin {margin:.4g}")
    out = dict(fixture="tiny-causal-f32", transformers_version=transformers.__version__,
               torch_version=torch.__version__, eos_token_id=eos, max_new_tokens=MAX_NEW, cases=cases)
    with open(os.path.join(FIX, "penalty_reference.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
