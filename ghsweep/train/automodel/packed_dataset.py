"""The dataset AutoModel's recipe trains on: the torch backend's packed dolly blocks.

The recipe instantiates `packed_dolly` from its YAML (`dataset._target_`), in its own data setup; it
reads the run's config.yaml, so records, tokenizer and packing are exactly the torch backend's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ghsweep.config.schema import typed
from ghsweep.core.run_dir import CONFIG
from ghsweep.train.dolly_data import IGNORE_INDEX, PackedDataset, load_blocks
from ghsweep.train.tokenizer import load_tokenizer


class ShiftedPackedDataset(PackedDataset):
    """Packed blocks with next-token labels: AutoModel's loss compares logits[i] with labels[i]."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        labels = torch.full_like(item["labels"], IGNORE_INDEX)
        labels[:-1] = item["labels"][1:]
        return item | {"labels": labels}


def packed_dolly(run_dir: str) -> ShiftedPackedDataset:
    composed = OmegaConf.load(Path(run_dir) / CONFIG)
    if not isinstance(composed, DictConfig):
        raise TypeError(f"{Path(run_dir) / CONFIG}: the run's config is a list, not a mapping")
    config = typed(composed)  # validated by the job that wrote it
    # On the CPU even inside the recipe's setup, which the backend runs under the CUDA device: the
    # dataloader's workers and pinned memory take host tensors.
    with torch.device("cpu"):
        return ShiftedPackedDataset(load_blocks(config, load_tokenizer(config)))
