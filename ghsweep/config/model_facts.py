"""The shape of the model a run trains, read from its folder where it has one.

Its own module because the NeMo recipe checks its config against this shape in the worker, which
loads no validation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.config.schema import ModelSchema, check
from ghsweep.core.errors import ConfigError


@dataclass(frozen=True)
class ModelFacts:
    """What validation needs to know about the model a run trains."""

    source: str  # how error messages name the model
    arch: str
    num_layers: int
    max_position_embeddings: int


def model_facts(model: DictConfig | ModelSchema) -> ModelFacts:
    """The trained model's shape: its folder's config.json with `model.path`, else the model config.

    A loaded checkpoint brings its own shape, so `offload.num_layers` and `train.seq_length` are
    checked against the folder, not against the YAML the folder replaced.
    """
    check("model.name", model.name)
    check("model.path", model.path)
    if not model.path:
        return ModelFacts(f"model={model.name}", model.arch, model.num_layers, model.max_position_embeddings)
    folder = Path(model.path)
    if not folder.is_dir():
        raise ConfigError(f"model.path={model.path}: no such folder; expected a Hugging Face model folder")
    config_file = folder / "config.json"
    try:
        hf = json.loads(config_file.read_text())
        if not isinstance(hf, dict):
            raise ValueError(f"a JSON {type(hf).__name__}, not an object")
        return ModelFacts(
            f"model.path={model.path}",
            hf["model_type"],
            int(hf["num_hidden_layers"]),
            int(hf["max_position_embeddings"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"model.path={model.path}: {config_file.name} is missing or lacks model_type, num_hidden_layers, "
            f"max_position_embeddings ({type(error).__name__}: {error}); expected a folder written by save_pretrained"
        ) from None
