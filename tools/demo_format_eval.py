#!/usr/bin/env python3
"""How well a demo model follows Inkling's chat format, and its held-out perplexity: the figures of
BENCHMARKS.md's "Demo model: chat format" section.

    python3 tools/demo_format_eval.py --model tests/fixtures/austen-demo --data TOKDIR [--turns 100]

`--model` is a container directory (decoded to float32 exactly as tools/make_demo_model.py does) and
TOKDIR holds tools/austen_conversations.py's `heldout_turns.json` and tools/demo_tokenizer.py's
`test.u16`. For each of the first `--turns` held-out turns (the prompt ends with the generation
prompt, as `chat` renders it) transformers generates up to `--max-new` tokens with the model's
generation_config.json (sampled when it samples; torch seed 0, one turn after another) and stops on
its EOS ids. A turn *ends by itself* when its last token is `<|content_model_end_sampling|>` (id 8)
before the limit; it *has an answer* when a `<|content_text|>` block (or the prefilled one) holds
text. Perplexity: exp of the mean next-token loss over non-overlapping 512-token windows of
test.u16 (Persuasion 21–24). Prints one JSON object.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_demo_model import load_dequantised, mean_loss  # noqa: E402

END_SAMPLING, CONTENT_TEXT, CONTENT_THINKING, END_MESSAGE = 8, 5, 6, 7


def answer_of(prompt, gen):
    """Text-block token count of a turn: tokens inside <|content_text|> blocks."""
    inside = prompt[-1] == CONTENT_TEXT
    n = 0
    for t in gen:
        if t == CONTENT_TEXT:
            inside = True
        elif t < 9:
            inside = False
        elif inside:
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_dequantised(args.model)
    gc = json.load(open(os.path.join(args.model, "generation_config.json")))
    eos = gc["eos_token_id"]
    sample = dict(do_sample=bool(gc.get("do_sample")))
    if sample["do_sample"]:
        sample.update(temperature=gc.get("temperature", 1.0), top_k=gc.get("top_k", 50), top_p=gc.get("top_p", 1.0))
    turns = json.load(open(os.path.join(args.data, "heldout_turns.json")))[: args.turns]
    torch.manual_seed(0)
    ended = answered = 0
    lengths = []
    for t in turns:
        ids = torch.tensor([t["prompt_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new,
                                 eos_token_id=eos, pad_token_id=0, **sample)
        gen = out[0, ids.shape[1]:].tolist()
        ended += gen[-1] == END_SAMPLING
        answered += answer_of(t["prompt_ids"], gen) > 0
        lengths.append(len(gen))
    test = np.fromfile(os.path.join(args.data, "test.u16"), dtype="<u2").tolist()
    loss = mean_loss(model, test)
    print(json.dumps(dict(model=args.model, turns=len(turns), max_new=args.max_new, sampling=sample,
                          ended_by_itself=ended / len(turns), with_answer=answered / len(turns),
                          mean_tokens=sum(lengths) / len(lengths), heldout_loss=round(loss, 4),
                          heldout_perplexity=round(math.exp(loss), 2))))


if __name__ == "__main__":
    main()
