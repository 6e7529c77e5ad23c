"""A byte-level tokenizer for models built from config (no vocabulary file to download)."""

from __future__ import annotations

from typing import Any

from ghsweep.config.schema import BYTE_TOKENIZER_IDS, ModelSchema


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


def load_tokenizer(model: ModelSchema) -> Any:
    """The tokenizer a run trains with: the checkpoint's (`model.path`), else the byte tokenizer."""
    if not model.path:
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model.path)


def pad_token_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return tokenizer.eos_token_id if pad is None else pad
