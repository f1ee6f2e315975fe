#!/usr/bin/env python3
"""Write tests/fixtures/tiny-chat-f32/chat_reference.json: an outside reference for `chat` and
`serve` on the chat fixture, one two-turn conversation with a thinking block.

    python tools/chat_reference.py

Needs torch and transformers 5.24.0 (tools/requirements.txt); float32, eager attention, CPU,
greedy `generate` (do_sample=False) with the stop id `<|content_model_end_sampling|>`.

The prompt ids are rendered here from the grammar of
shared/reference/INKLING-CHAT-AND-SERVE.md §3.4 (specials by id from the fixture's tokenizer,
text with `Tokenizer.encode(text, add_special_tokens=False)`), not by the engine:
  effort block  <|message_system|><|content_text|>Thinking effort level: 0.9<|end_message|>
                (0.9 = `chat --effort high`, the default, and serve's default when
                reasoning_effort is unset), before the first message (no system message here);
  user turn     <|message_user|><|content_text|>TEXT<|end_message|>;
  generation    <|message_model|> (effort > 0: the model may open a thinking block itself).
The second turn's history differs by command:
  - `chat` keeps the model's own ids and closes a turn cut by max_tokens with
    <|end_message|><|content_model_end_sampling|> (the grammar's model turn ends with both);
  - `serve` gets the OpenAI messages back and renders the assistant message as the official
    renderer does (reasoning_content dropped):
    <|message_model|><|content_text|>CONTENT<|end_message|><|content_model_end_sampling|>.
Answers are split as the parsers of §3.4 do: ids after <|content_thinking|> up to the next
block marker are the thinking (OpenAI `reasoning_content`), ids after <|content_text|> the
text (`content`); ids outside any block (before the first kind token, or after a block's
<|end_message|>, <|message_model|> or <|content_model_end_sampling|>) are text too, as the engine
shows them (src/chat/parse.rs); other specials are skipped. Texts are the tokenizer's decode.

The user messages were chosen (a search over short word strings, not part of this script)
because the random tiny model's greedy answers open a thinking block and then a text block
(the first, cut by max_tokens) and, in `chat`'s history, a thinking and a text block ended by
the stop id (the second; on serve's history the second answer shows no block). `min_top1_margin` (top-1 minus top-2 logit over every generated position) shows how far
each greedy choice is from a tie.
"""

import json
import os

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "fixtures", "tiny-chat-f32")
OUT = os.path.join(MODEL, "chat_reference.json")
MESSAGES = ["Sun fox the", "Thanks!"]
EFFORT = "0.9"
MAX_TOKENS = 40


def main():
    torch.manual_seed(0)
    tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    sp = {
        n: tok.token_to_id(f"<|{n}|>")
        for n in [
            "message_user",
            "message_model",
            "message_system",
            "content_text",
            "content_thinking",
            "end_message",
            "content_model_end_sampling",
        ]
    }
    stop = sp["content_model_end_sampling"]
    markers = {sp["content_text"], sp["content_thinking"], sp["end_message"], stop,
               sp["message_model"], sp["message_user"], sp["message_system"]}
    model = AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    def enc(text):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert not set(ids) & set(sp.values()), text
        return ids

    def block(role, text):
        return [sp[role], sp["content_text"]] + enc(text) + [sp["end_message"]]

    def generate(prompt):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=[stop],
                pad_token_id=tok.token_to_id("<|endoftext|>"),
                output_scores=True,
                return_dict_in_generate=True,
            )
        ids = out.sequences[0, len(prompt):].tolist()
        margin = min(
            float(torch.topk(s[0], 2).values[0] - torch.topk(s[0], 2).values[1])
            for s in out.scores
        )
        return ids, margin

    def split(ids):
        thinking, text = [], []
        cur = text  # outside any block: shown as the answer
        for i in ids:
            if i == sp["content_thinking"]:
                cur = thinking
            elif i in (sp["content_text"], sp["end_message"], sp["message_model"], stop):
                cur = text
            elif i in markers:
                pass
            else:
                cur.append(i)
        return tok.decode(thinking, skip_special_tokens=False), tok.decode(
            text, skip_special_tokens=False
        )

    def turn(prompt):
        ids, margin = generate(prompt)
        thinking, text = split(ids)
        return {
            "prompt_ids": prompt,
            "generated_ids": ids,
            "finish": "eos" if ids and ids[-1] == stop else "length",
            "thinking": thinking,
            "text": text,
            "min_top1_margin": margin,
        }

    def close(turn_ids):
        if turn_ids and turn_ids[-1] == stop:
            return []
        if turn_ids and turn_ids[-1] == sp["end_message"]:
            return [stop]
        return [sp["end_message"], stop]

    effort = block("message_system", f"Thinking effort level: {EFFORT}")
    first = effort + block("message_user", MESSAGES[0]) + [sp["message_model"]]
    t1 = turn(first)
    assert t1["thinking"] and t1["text"], t1
    chat_history = first + t1["generated_ids"] + close(t1["generated_ids"])
    chat2 = turn(chat_history + block("message_user", MESSAGES[1]) + [sp["message_model"]])
    serve_history = (
        effort
        + block("message_user", MESSAGES[0])
        + [sp["message_model"], sp["content_text"]]
        + enc(t1["text"])
        + [sp["end_message"], stop]
    )
    serve2 = turn(serve_history + block("message_user", MESSAGES[1]) + [sp["message_model"]])
    doc = {
        "fixture": "tiny-chat-f32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "effort": EFFORT,
        "max_tokens": MAX_TOKENS,
        "stop_ids": [stop],
        "messages": MESSAGES,
        "chat": [t1, chat2],
        "serve": [t1, serve2],
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for k in ("chat", "serve"):
        for n, t in enumerate(doc[k]):
            print(f"{k} turn {n}: {len(t['prompt_ids'])} prompt ids, {t['generated_ids']} "
                  f"({t['finish']}, margin {t['min_top1_margin']:.3f})")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
