"""Model folders for tests."""

from __future__ import annotations

import json
from pathlib import Path

# A small Llama's shape as transformers' LlamaConfig takes it (kwargs), for tests that build one.
TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
# The message safetensors gives for the weights unreadable_model writes.
UNREADABLE_WEIGHTS_ERROR = "SafetensorError: Error while deserializing header: header too large"


def unreadable_model(folder: Path) -> Path:
    """A tiny Llama folder that passes every check before training (its config.json is whole) but
    whose weights are not a safetensors file: the worker itself fails after it started, on any node."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 512, **shape}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def saved_hf_llama(folder: Path) -> Path:
    """A small Llama saved with save_pretrained into `folder`, with a BPE tokenizer trained on dolly records."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from ghsweep.train import dolly_data as dolly

    texts = [dolly.prompt_text(r) + r["response"] for r in dolly.synthetic_dolly(300, seed=5)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        **TINY_LLAMA,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Trained norms are not the initial 1.0: a conversion that skips them shows.
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.uniform_(param, 0.5, 1.5)
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").exists()
    return folder


def tiny_lora_decoder(*overrides: str):
    """The tiny Llama's decoder as training builds it on CPU in fp32, with the adapters of `overrides`'
    peft group and non-zero B matrices, so that the adapters take part in outputs and gradients."""
    import torch

    from ghsweep.train.model import apply_peft, build_model
    from ghsweep.train.tokenizer import ByteTokenizer
    from tests.support.compose import compose_typed

    torch.manual_seed(0)
    config = compose_typed("model=tiny_llama", *overrides)
    model, _ = build_model(config.model, ByteTokenizer(), torch.device("cpu"), torch.float32)
    model = apply_peft(model, config.peft, torch.float32)
    base = model.get_base_model() if config.peft.name == "lora" else model
    for name, param in base.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return base.model
