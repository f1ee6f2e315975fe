#!/usr/bin/env python3
"""TMLv0 conversations from the Austen corpus, for training the demo model to follow Inkling's chat
format, and the held-out turns that measure it.

    python3 tools/austen_conversations.py --deb r-cran-janeaustenr_1.0.0-1_all.deb \
        --tokenizer TOKDIR/tokenizer.json --out TOKDIR

A *speech* is a paragraph with a quotation in double quotes; its text is the quoted parts joined with
one space (the narration between them, "said Emma", is dropped); its speaker is the name after
said/cried/replied/answered/… in the narration, when there is one. Consecutive speeches of a
chapter become turns: the first is the user's, the next the model's, and so on (a conversation is
1–3 exchanges; runs are cut into pieces of at most 6 speeches, once from their first speech and
once from their second; in the held-out chapters every two consecutive speeches are one exchange). Each conversation is rendered as
`src/chat/render.rs` writes a prompt (and as `tml-renderers` does): an optional system message
naming the book, the effort block (`Thinking effort level: E`), then the turns; a model turn in
the history is `<|message_model|><|content_text|>TEXT<|end_message|><|content_model_end_sampling|>`.
The last model turn, when the effort is not 0, starts with a short thinking block that closes:
`<|message_model|><|content_thinking|>Emma replies.<|end_message|><|message_model|><|content_text|>…`
(at effort 0 it has none: the engine prefills `<|content_text|>` then). Every choice (system line or
not, effort) comes from a PRNG seeded with `--seed`, so the output is a function of the corpus.

Writes into OUT:
- `conv_train.u16`: the conversations of the training chapters (the split of tools/austen_corpus.py),
  each followed by `<|endoftext|>` (little-endian u16 ids, as tools/demo_tokenizer.py's files);
- `conv_valid.u16`: the same for the validation chapters;
- `heldout_turns.json`: turns of the validation and test chapters (Northanger Abbey 30–31,
  Persuasion 21–24, never trained on): each the
  prompt ids up to and including the generation prompt, its effort, and the reference answer.
"""

import argparse
import json
import os
import random
import re
import sys

import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from austen_corpus import NOVELS, TEST, VALID, chapters, load_rdb, read_records  # noqa: E402
from demo_tokenizer import SPECIALS  # noqa: E402

SP = {s.strip("<|>"): i for i, s in enumerate(SPECIALS)}
TITLES = {
    "emma": "Emma",
    "mansfield_park": "Mansfield Park",
    "northanger_abbey": "Northanger Abbey",
    "persuasion": "Persuasion",
    "pride_and_prejudice": "Pride and Prejudice",
    "sense_and_sensibility": "Sense and Sensibility",
}
# (name, effort text) of the efforts trained on; 0 means no thinking block
EFFORTS = [("none", "0"), ("minimal", "0.1"), ("low", "0.2"), ("medium", "0.7"), ("high", "0.9"), ("max", "0.99")]
EFFORT_WEIGHTS = [4, 1, 1, 1, 2, 1]
SPEECH_CHARS = 1000  # longer speeches are skipped
VERB = r"(?:said|cried|replied|answered|continued|added|returned|exclaimed|asked|observed|whispered)"
TITLE = r"(?:(?:Mr|Mrs|Miss|Lady|Sir|Colonel|Captain|Dr|Admiral)\.? )?"
SPEAKER = [re.compile(VERB + r" (" + TITLE + r"[A-Z][a-z]+)"), re.compile(r"(" + TITLE + r"[A-Z][a-z]+) " + VERB)]


def speech(paragraph):
    """(text, speaker or None) of a paragraph that starts with a quote, else None."""
    parts = re.findall(r'"([^"]+)"', paragraph)
    text = " ".join(p.strip() for p in parts).strip()
    if not text or len(text) > SPEECH_CHARS:
        return None
    narration = re.sub(r'"[^"]*"', " ", paragraph)
    who = None
    for pat in SPEAKER:
        m = pat.search(narration)
        if m and m.group(1) not in {"He", "She", "I", "It", "They", "The"}:
            who = m.group(1)
            break
    return text, who


def runs(paragraphs):
    """Runs of consecutive speeches."""
    out, cur = [], []
    for p in paragraphs:
        s = speech(p)
        if s:
            cur.append(s)
        else:
            if len(cur) >= 2:
                out.append(cur)
            cur = []
    if len(cur) >= 2:
        out.append(cur)
    return out


class Render:
    def __init__(self, tok):
        self.tok = tok

    def text(self, s):
        ids = self.tok.encode(s, add_special_tokens=False).ids
        assert not any(i < len(SPECIALS) for i in ids), s
        return ids

    def block(self, role, kind, s):
        return [SP[role], SP[kind]] + self.text(s) + [SP["end_message"]]

    def conversation(self, book, turns, rng):
        """(ids of the whole conversation, ids of the prompt before the last model turn's
        generation prompt, generation prompt ids, last answer, effort name)."""
        ids = []
        if rng.random() < 0.7:
            ids += self.block("message_system", "content_text", f"A conversation from {book}, by Jane Austen.")
        name, e = rng.choices(EFFORTS, weights=EFFORT_WEIGHTS)[0]
        ids += self.block("message_system", "content_text", f"Thinking effort level: {e}")
        prompt = None
        for i in range(0, len(turns), 2):
            ids += self.block("message_user", "content_text", turns[i][0])
            last = i + 2 >= len(turns)
            answer, who = turns[i + 1]
            if last:
                prompt = list(ids)
                gen = [SP["message_model"]] + ([SP["content_text"]] if e == "0" else [])
            if last and e != "0":
                think = f"{who} replies." if who else "I reply as the book would."
                ids += self.block("message_model", "content_thinking", think)
            ids += self.block("message_model", "content_text", answer) + [SP["content_model_end_sampling"]]
        return ids, prompt, gen, turns[-1][0], name


def conversations(paragraphs, rng, pairs=False):
    """Pieces of 2, 4 or 6 speeches of each run, from its first speech and again from its second
    (so each speech is once the user's and once the model's); with `pairs`, every two consecutive
    speeches instead (one exchange each)."""
    out = []
    for run in runs(paragraphs):
        if pairs:
            out += [run[i : i + 2] for i in range(len(run) - 1)]
            continue
        for start in (0, 1):
            i = start
            while len(run) - i >= 2:
                n = min(rng.choice([2, 2, 4, 6]), (len(run) - i) // 2 * 2)
                out.append(run[i : i + n])
                i += n
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deb", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=512, help="conversations longer than this are skipped")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    r = Render(Tokenizer.from_file(args.tokenizer))
    recs = read_records(load_rdb(args.deb))
    split = {"train": [], "valid": [], "test": []}
    for (name, _), lines in zip(NOVELS, recs):
        for num, paras in chapters(lines):
            s = "test" if (name, num) in {(TEST[0], c) for c in TEST[1]} else (
                "valid" if (name, num) in {(VALID[0], c) for c in VALID[1]} else "train")
            for turns in conversations(paras, rng, pairs=s != "train"):
                split[s].append((TITLES[name], turns))
    os.makedirs(args.out, exist_ok=True)
    for s in ("train", "valid"):
        ids, n, kept = [], 0, 0
        for book, turns in split[s]:
            conv = r.conversation(book, turns, rng)[0]
            n += 1
            if len(conv) + 1 > args.ctx:
                continue
            ids += conv + [SP["endoftext"]]
            kept += 1
        np.asarray(ids, dtype="<u2").tofile(os.path.join(args.out, f"conv_{s}.u16"))
        print(f"conv_{s}: {kept} of {n} conversations, {len(ids)} tokens")
    held = []
    for book, turns in split["valid"] + split["test"]:
        _, prompt, gen, _, effort = r.conversation(book, turns, rng)
        held.append(dict(book=book, effort=effort, prompt_ids=prompt + gen, answer=turns[-1][0]))
    with open(os.path.join(args.out, "heldout_turns.json"), "w") as f:
        json.dump(held, f)
    print(f"heldout_turns: {len(held)} turns")


if __name__ == "__main__":
    main()
