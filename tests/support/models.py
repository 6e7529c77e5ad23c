"""Model folders for tests."""

from __future__ import annotations

import json
from pathlib import Path

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
