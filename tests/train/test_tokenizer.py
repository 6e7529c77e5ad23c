"""The project's subword tokenizer: shipped, reproducible from the synthetic records, and the one a run uses."""

from __future__ import annotations

import json

from ghsweep.config.schema import BPE_VOCAB_SIZE
from ghsweep.train.tokenizer import BPE_FILE, BpeTokenizer, ByteTokenizer, load_tokenizer, train_bpe
from tests.support.compose import compose_typed


def test_the_shipped_bpe_is_what_train_bpe_learns():
    shipped = json.loads(BPE_FILE.read_text())
    learned = json.loads(train_bpe())
    assert shipped["model"] == learned["model"]
    assert len(shipped["model"]["vocab"]) == BPE_VOCAB_SIZE == BpeTokenizer.vocab_size
    special = {t["content"]: t["id"] for t in shipped["added_tokens"]}
    assert special == {"<s>": BpeTokenizer.bos_token_id, "</s>": BpeTokenizer.eos_token_id, "<pad>": 2}


def test_auto_is_bpe_on_the_fly_and_bytes_ahead():
    assert isinstance(load_tokenizer(compose_typed()), ByteTokenizer)
    assert isinstance(load_tokenizer(compose_typed("data.prepare=on_the_fly")), BpeTokenizer)
    assert isinstance(load_tokenizer(compose_typed("data.tokenizer=bpe")), BpeTokenizer)
    assert isinstance(load_tokenizer(compose_typed("data.prepare=on_the_fly", "data.tokenizer=byte")), ByteTokenizer)
