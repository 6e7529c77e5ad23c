"""The tokenizer a run trains with: the checkpoint's (model.path), the byte tokenizer, or the project's
subword (BPE) tokenizer, shipped as bpe_tokenizer.json (no vocabulary file to download).

The BPE tokenizer is Hugging Face `tokenizers`' byte-level BPE, trained once on the synthetic dolly
records (`train_bpe`, `python -m ghsweep.train.tokenizer PATH` rewrites the file): 320 ids, the tiny
model's vocabulary, so every model built from config can embed them. It does the per-character work a
real tokenizer does (byte-level pre-tokenisation, BPE merges in Rust), which is what a loader that
tokenises on the fly (data.prepare=on_the_fly) spends its time on.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ghsweep.config.schema import BPE_VOCAB_SIZE, BYTE_TOKENIZER_IDS, ConfigSchema, tokenizer_name

BPE_FILE = Path(__file__).with_name("bpe_tokenizer.json")
BPE_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: BOS, EOS, PAD
# The corpus train_bpe learned bpe_tokenizer.json from: this many synthetic records of this seed.
BPE_CORPUS_RECORDS = 2000
BPE_CORPUS_SEED = 0


class ByteTokenizer:
    """UTF-8 bytes are token ids 0-255; BOS, EOS and PAD follow them."""

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = BYTE_TOKENIZER_IDS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BpeTokenizer:
    """bpe_tokenizer.json through `tokenizers`. Picklable (a DataLoader's workers get a copy)."""

    bos_token_id = 0
    eos_token_id = 1
    pad_token_id = 2
    vocab_size = BPE_VOCAB_SIZE

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(BPE_FILE))

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


def load_tokenizer(config: ConfigSchema) -> Any:
    """The tokenizer a run trains with: the checkpoint's (`model.path`), else data.tokenizer's."""
    if config.model.path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        if tokenizer.bos_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError(f"model.path={config.model.path}: the tokenizer defines no BOS/EOS token")
        return tokenizer
    return BpeTokenizer() if tokenizer_name(config.data) == "bpe" else ByteTokenizer()


def pad_token_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return tokenizer.eos_token_id if pad is None else pad


def train_bpe() -> str:
    """bpe_tokenizer.json's text: a byte-level BPE of BPE_VOCAB_SIZE ids learned from the synthetic records."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ghsweep.train.dolly_data import prompt_text, synthetic_dolly

    records = synthetic_dolly(BPE_CORPUS_RECORDS, BPE_CORPUS_SEED)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([prompt_text(r) + r["response"] for r in records], trainer)
    return tokenizer.to_str(pretty=True)


if __name__ == "__main__":
    Path(sys.argv[1] if len(sys.argv) > 1 else BPE_FILE).write_text(train_bpe() + "\n", encoding="utf-8")
