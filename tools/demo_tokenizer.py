#!/usr/bin/env python3
"""The demo model's tokenizer: a byte-level BPE trained on the Austen training split, with Inkling's
chat special tokens carried by name; and the token ids of the three splits for training.

    python3 tools/austen_corpus.py --deb r-cran-janeaustenr_1.0.0-1_all.deb --out CORPUS
    python3 tools/demo_tokenizer.py --corpus CORPUS --out TOKDIR

Writes TOKDIR/tokenizer.json, TOKDIR/tokenizer_config.json and TOKDIR/{train,valid,test}.u16
(little-endian uint16 token ids: `train_docs.txt`, whose chapters end with `<|endoftext|>`,
`valid.txt` and `test.txt`, each encoded as one text without added special tokens).

Tokenizer (HF `tokenizers` 0.23): BPE model, ByteLevel pre-tokenizer (GPT-2 split regex, no
prefix space), ByteLevel decoder, `VOCAB` ids in all. Ids 0..8 are the special tokens below, in
this order, as special added tokens; Inkling's real ids (199999, 200000, …; see
`../shared/reference/INKLING-CHAT-AND-SERVE.md`) differ, the chat renderer finds them by name.
Training is deterministic for a given corpus (the BPE trainer breaks ties by byte order).
"""

import argparse
import hashlib
import json
import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 4096
SPECIALS = [
    "<|endoftext|>",
    "<|message_user|>",
    "<|message_model|>",
    "<|message_system|>",
    "<|message_tool|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|end_message|>",
    "<|content_model_end_sampling|>",
]
EOT = SPECIALS.index("<|endoftext|>")
END_SAMPLING = SPECIALS.index("<|content_model_end_sampling|>")


def train_bpe(train_text: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # one paragraph per sample, so that merges never span paragraphs
    tok.train_from_iterator(train_text.split("\n\n"), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB, tok.get_vocab_size()
    return tok


def write_tokenizer(tok: Tokenizer, d: str, model_max_length: int):
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "model_max_length": model_max_length,
                "additional_special_tokens": SPECIALS[1:],
            },
            f,
            indent=2,
        )
        f.write("\n")


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text, "decode(encode(text)) != text"
    return np.asarray(ids, dtype="<u2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="output directory of tools/austen_corpus.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-max-length", type=int, default=256)
    args = ap.parse_args()
    read = lambda n: open(os.path.join(args.corpus, n), encoding="utf-8").read()
    tok = train_bpe(read("train.txt"))
    os.makedirs(args.out, exist_ok=True)
    write_tokenizer(tok, args.out, args.model_max_length)
    for split, name in [("train", "train_docs.txt"), ("valid", "valid.txt"), ("test", "test.txt")]:
        text = read(name)
        ids = encode(tok, text)
        ids.tofile(os.path.join(args.out, f"{split}.u16"))
        print(f"{split}: {len(ids)} tokens, {len(text.encode()) / len(ids):.3f} bytes/token, "
              f"{int((ids == EOT).sum())} <|endoftext|>")
    h = hashlib.sha256(open(os.path.join(args.out, "tokenizer.json"), "rb").read()).hexdigest()
    print(f"tokenizer.json sha256 {h}")


if __name__ == "__main__":
    main()
