"""Instruction data in the databricks-dolly-15k format, tokenised, masked and packed.

Each record has `instruction`, `context`, `response` and `category`. The prompt (instruction and
context) is masked out of the loss; only response tokens are learned. Examples are packed
back-to-back into blocks of `seq_length` tokens, each keeping its own position ids, as NeMo's
packed SFT data does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

IGNORE_INDEX = -100
DOLLY_FIELDS = ("instruction", "context", "response", "category")


class Tokenizer(Protocol):
    bos_token_id: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...


def prompt_text(record: dict) -> str:
    """The prompt the model sees before the response (Alpaca / NeMo dolly style)."""
    text = f"### Instruction:\n{record['instruction']}\n\n"
    if record.get("context"):
        text += f"### Context:\n{record['context']}\n\n"
    return text + "### Response:\n"


_WORDS = (
    "apple river stone cloud tiger maple piano rocket garden silver lantern harbor falcon "
    "meadow copper violet canyon orbit pepper willow ember glacier"
).split()
_COUNTRIES = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
    "Egypt": "Cairo", "Canada": "Ottawa", "Chile": "Santiago", "India": "New Delhi",
}


def synthetic_dolly(num_examples: int, seed: int) -> list[dict]:
    """Dolly-format records of small tasks a tiny model can learn within a smoke run."""
    rng = random.Random(seed)
    records = []
    for _ in range(num_examples):
        kind = rng.randrange(5)
        word = rng.choice(_WORDS)
        if kind == 0:
            a, b = rng.randrange(50), rng.randrange(50)
            rec = ("open_qa", f"What is {a} plus {b}?", "", str(a + b))
        elif kind == 1:
            country = rng.choice(sorted(_COUNTRIES))
            rec = ("closed_qa", f"What is the capital of {country}?",
                   f"The capital of {country} is {_COUNTRIES[country]}.", _COUNTRIES[country])
        elif kind == 2:
            rec = ("creative_writing", f"Repeat the word {word} three times.", "",
                   " ".join([word] * 3))
        elif kind == 3:
            rec = ("general_qa", f"Spell {word} backwards.", "", word[::-1])
        else:
            name, age = rng.choice(_WORDS).title(), rng.randrange(18, 90)
            rec = ("information_extraction", "How old is the person described?",
                   f"Name: {name}. Age: {age}. Favourite word: {word}.", str(age))
        records.append(dict(zip(("category", "instruction", "context", "response"), rec)))
    return records


def load_dolly_jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read a dolly-format JSONL file; every line must carry the dolly fields."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            missing = [k for k in ("instruction", "response") if k not in record]
            if missing:
                raise ValueError(f"{path}:{line_no}: record lacks {missing}; dolly records have {DOLLY_FIELDS}")
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    return records


def load_records(data: DictConfig, seed: int) -> list[dict]:
    """The run's dolly records: `data.path` when set, else the synthetic set."""
    if data.path:
        return load_dolly_jsonl(data.path, data.num_examples)
    return synthetic_dolly(data.num_examples, seed=seed)


def write_dolly_jsonl(records: list[dict], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def tokenize(record: dict, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """Token ids and labels of one example; prompt positions are IGNORE_INDEX in the labels."""
    prompt = [tokenizer.bos_token_id, *tokenizer.encode(prompt_text(record))]
    response = [*tokenizer.encode(record["response"]), tokenizer.eos_token_id]
    return prompt + response, [IGNORE_INDEX] * len(prompt) + response


@dataclass
class PackedBlocks:
    input_ids: torch.Tensor  # (blocks, seq_length)
    labels: torch.Tensor  # (blocks, seq_length), IGNORE_INDEX on prompts and padding
    position_ids: torch.Tensor  # (blocks, seq_length), restarting at 0 for each example
    dropped: int = 0  # examples longer than seq_length, left out

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def pack(examples: Iterator[tuple[list[int], list[int]]], seq_length: int, pad_id: int) -> PackedBlocks:
    """Greedy in-order packing. An example longer than a block is dropped (truncating it would cut
    the response, the only part that is learned); `dropped` counts them."""
    blocks: list[tuple[list[int], list[int], list[int]]] = []
    dropped = 0
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []

    def close_block() -> None:
        pad = seq_length - len(ids)
        blocks.append((ids + [pad_id] * pad, labels + [IGNORE_INDEX] * pad, positions + list(range(pad))))

    for ex_ids, ex_labels in examples:
        if len(ex_ids) > seq_length:
            dropped += 1
            continue
        if len(ids) + len(ex_ids) > seq_length:
            close_block()
            ids, labels, positions = [], [], []
        ids += ex_ids
        labels += ex_labels
        positions += list(range(len(ex_ids)))
    if ids:
        close_block()
    if not blocks:
        raise ValueError(f"train.seq_length={seq_length}: every example is longer; raise it")
    as_tensor = lambda i: torch.tensor([b[i] for b in blocks], dtype=torch.long)  # noqa: E731
    return PackedBlocks(as_tensor(0), as_tensor(1), as_tensor(2), dropped)


class PackedDataset(Dataset):
    def __init__(self, blocks: PackedBlocks):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.blocks.input_ids[i],
            "labels": self.blocks.labels[i],
            "position_ids": self.blocks.position_ids[i],
        }


def make_dataloader(
    blocks: PackedBlocks,
    batch_size: int,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    prefetch_factor: int | None,
    persistent_workers: bool,
) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        PackedDataset(blocks),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=generator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=persistent_workers and num_workers > 0,
    )


def endless(loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """Cycle through epochs so a run lasts `max_steps` whatever the data size."""
    while True:
        yield from loader
