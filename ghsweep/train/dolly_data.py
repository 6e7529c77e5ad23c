"""Instruction data in the databricks-dolly-15k format, tokenised, masked and packed.

Each record has `instruction`, `context`, `response` and `category`. The prompt (instruction and
context) is masked out of the loss; only response tokens are learned. Examples are packed
back-to-back into blocks of `seq_length` tokens, each keeping its own position ids, as NeMo's
packed SFT data does. data.prepare says when: all before training (ahead), or each block as the
data loader reads it (on_the_fly), into the same blocks.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ghsweep.config.schema import ConfigSchema, DataSchema, carried
from ghsweep.train.tokenizer import pad_token_id

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
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Chile": "Santiago",
    "India": "New Delhi",
}
# Shape of databricks-dolly-15k's record lengths: log-normal, most records short, a long tail of
# records with long contexts or responses. The mean (data.mean_tokens, default 210 tokens under
# the Llama-2 tokenizer) is the dataset's text size over its record count: the JSONL file is
# ~13.1 MB for 15,011 records, ~800 characters of instruction + context + response each, at ~3.8
# characters per Llama-2 token. The spread (sigma) and the response share are assumptions in line
# with the dataset's character statistics, not measured token percentiles. A record cannot be
# shorter than its prompt template and task (~53 byte-level tokens), which lifts the short end:
# with the byte tokenizer, mean_tokens=210 and seq 4096 the examples (template, BOS and EOS
# included) measure mean 235, p10 73, p50 133, p90 459, p99 1366 tokens (the log-normal itself:
# median 127, p90 458, p99 1300; tests/train/test_data.py checks these figures).
LENGTH_SIGMA = 1.0
RESPONSE_SHARE = 0.45
MIN_TOKENS = 16


def sample_length(rng: random.Random, mean_tokens: float, max_tokens: int) -> int:
    """A record length in tokens: log-normal of mean `mean_tokens`, redrawn above `max_tokens`.

    Records longer than a packed block would be dropped by packing; the synthetic set does not
    make them, so the lengths are the distribution conditioned on fitting a block.
    """
    mu = math.log(mean_tokens) - LENGTH_SIGMA**2 / 2
    while True:
        length = round(rng.lognormvariate(mu, LENGTH_SIGMA))
        if min(MIN_TOKENS, max_tokens) <= length <= max_tokens:
            return length


def _task(rng: random.Random) -> tuple[str, str, str, str]:
    """(category, instruction, context, answer) of a small task a tiny model can learn."""
    kind = rng.randrange(5)
    word = rng.choice(_WORDS)
    if kind == 0:
        a, b = rng.randrange(50), rng.randrange(50)
        return "open_qa", f"What is {a} plus {b}?", "", str(a + b)
    if kind == 1:
        country = rng.choice(sorted(_COUNTRIES))
        return (
            "closed_qa",
            f"What is the capital of {country}?",
            f"The capital of {country} is {_COUNTRIES[country]}.",
            _COUNTRIES[country],
        )
    if kind == 2:
        return "creative_writing", f"Repeat the word {word} three times.", "", " ".join([word] * 3)
    if kind == 3:
        return "general_qa", f"Spell {word} backwards.", "", word[::-1]
    name, age = rng.choice(_WORDS).title(), rng.randrange(18, 90)
    return (
        "information_extraction",
        "How old is the person described?",
        f"Name: {name}. Age: {age}. Favourite word: {word}.",
        str(age),
    )


def _words(first: int, chars: int, step: int = 1) -> str:
    """Words of _WORDS from index `first` on, every `step`-th, cyclically, up to `chars` characters."""
    out: list[str] = []
    i, size = first, 0
    while size + len(_WORDS[i % len(_WORDS)]) + 1 <= chars:
        out.append(_WORDS[i % len(_WORDS)])
        size += len(out[-1]) + 1
        i += step
    return " ".join(out)


def _record(rng: random.Random, chars: int) -> dict:
    """One task record of about `chars` characters, template included."""
    category, instruction, context, answer = _task(rng)
    start = rng.randrange(len(_WORDS))
    response = answer
    if chars > len(prompt_text({"instruction": instruction, "context": context})) + len(answer) + 40:
        # Room for more than the answer: the response goes on with a list the instruction asks for.
        instruction += f" Then list words from {_WORDS[start]}."
        response_chars = max(len(answer) + 1, round(RESPONSE_SHARE * chars))
        response = f"{answer}. {_words(start, response_chars - len(answer) - 2)}".rstrip()
    record = {"category": category, "instruction": instruction, "context": context, "response": response}
    # What the template and the answer leave of the length goes to the context.
    context_chars = chars - len(prompt_text(record)) - len(response) - 2
    if context_chars > 2:
        padding = _words(rng.randrange(len(_WORDS)), context_chars - len(context) - 1, step=7)
        record["context"] = f"{context} {padding}".strip()
    return record


def synthetic_dolly(
    num_examples: int, seed: int, mean_tokens: float = 210, max_tokens: int = 4096, chars_per_token: float = 1.0
) -> list[dict]:
    """Dolly-format records with dolly-like lengths (sample_length) made of learnable tasks.

    Each record is a small task (arithmetic, a capital, spelling...) whose answer is followed by a
    list of words continuing from a word the instruction names, in a fixed order, so a tiny model's
    loss falls within a smoke run; the context is padded with other words (masked from the loss).
    `chars_per_token` of the run's tokenizer turns token lengths into text lengths.
    """
    rng = random.Random(seed)
    records: list[dict] = []
    misses = 0
    while len(records) < num_examples:
        record = _record(rng, round(sample_length(rng, mean_tokens, max_tokens) * chars_per_token))
        # A short length can fall below what the task itself takes: draw again rather than overflow a block.
        if (len(prompt_text(record)) + len(record["response"])) / chars_per_token + 2 <= max_tokens:
            records.append(record)
            misses = 0
        elif (misses := misses + 1) > 1000:
            raise ValueError(f"train.seq_length={max_tokens}: shorter than any synthetic dolly record; raise it")
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


def chars_per_token(tokenizer: Tokenizer) -> float:
    """Characters per token of `tokenizer` on the synthetic records' words (1.0 for bytes)."""
    text = _words(0, 2000)
    return len(text) / len(tokenizer.encode(text))


def load_records(data: DataSchema, seed: int, seq_length: int, tokenizer: Tokenizer) -> list[dict]:
    """The run's dolly records: `data.path` when set, else the synthetic set sized in `tokenizer`'s
    tokens to fit blocks of `seq_length`."""
    if data.path:
        return load_dolly_jsonl(data.path, data.num_examples)
    examples = carried(data.num_examples, "data.num_examples")
    mean_tokens = carried(data.mean_tokens, "data.mean_tokens")
    return synthetic_dolly(examples, seed, mean_tokens, seq_length, chars_per_token(tokenizer))


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


@dataclass
class BlockPlan:
    """Which examples make each block: greedy in-order packing of their token counts. An example longer
    than a block is dropped (truncating it would cut the response, the only part that is learned)."""

    seq_length: int
    examples: list[list[int]]  # per block, the indices of its examples in record order
    dropped: int  # examples longer than seq_length, left out

    @classmethod
    def of(cls, lengths: Sequence[int], seq_length: int) -> BlockPlan:
        blocks: list[list[int]] = []
        block: list[int] = []
        filled = dropped = 0
        for i, length in enumerate(lengths):
            if length > seq_length:
                dropped += 1
                continue
            if filled + length > seq_length:
                blocks.append(block)
                block, filled = [], 0
            block.append(i)
            filled += length
        if block:
            blocks.append(block)
        if not blocks:
            raise ValueError(f"train.seq_length={seq_length}: every example is longer; raise it")
        return cls(seq_length, blocks, dropped)

    def __len__(self) -> int:
        return len(self.examples)


def build_block(
    examples: Iterable[tuple[list[int], list[int]]], seq_length: int, pad_id: int
) -> tuple[list[int], list[int], list[int]]:
    """(input ids, labels, position ids) of one block: the examples back to back, each with its own
    positions, then padding (ignored by the loss)."""
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for ex_ids, ex_labels in examples:
        ids += ex_ids
        labels += ex_labels
        positions += range(len(ex_ids))
    pad = seq_length - len(ids)
    return ids + [pad_id] * pad, labels + [IGNORE_INDEX] * pad, positions + list(range(pad))


def pack(examples: Iterable[tuple[list[int], list[int]]], seq_length: int, pad_id: int) -> PackedBlocks:
    """Every block of the tokenised examples (BlockPlan's packing), as tensors."""
    tokenised = list(examples)
    plan = BlockPlan.of([len(ids) for ids, _ in tokenised], seq_length)
    blocks = [build_block((tokenised[i] for i in block), seq_length, pad_id) for block in plan.examples]
    as_tensor = lambda i: torch.tensor([b[i] for b in blocks], dtype=torch.long)  # noqa: E731
    return PackedBlocks(as_tensor(0), as_tensor(1), as_tensor(2), plan.dropped)


def load_blocks(config: ConfigSchema, tokenizer: Tokenizer) -> PackedBlocks:
    """The packed blocks a run of `config` trains on (every backend counts attention FLOPs on them)."""
    records = load_records(config.data, config.seed, config.train.seq_length, tokenizer)
    return pack((tokenize(r, tokenizer) for r in records), config.train.seq_length, pad_token_id(tokenizer))


class PackedDataset(Dataset):
    """data.prepare=ahead: blocks tokenised and packed before training; the loader only indexes them."""

    def __init__(self, blocks: PackedBlocks):
        self.blocks = blocks
        self.dropped = blocks.dropped

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.blocks.input_ids[i],
            "labels": self.blocks.labels[i],
            "position_ids": self.blocks.position_ids[i],
        }

    def position_ids(self) -> torch.Tensor:
        return self.blocks.position_ids


class OnTheFlyDataset(Dataset):
    """data.prepare=on_the_fly: block i's records are tokenised, masked and packed when the loader reads it
    (in its workers with num_workers > 0), as a fine-tuning loader that transforms lazily does.

    The packing plan (which records make each block) is fixed at start from the records' token counts (each
    record tokenised once to count them, as an offline packing step sizes its bins), so any worker can build
    any block and the blocks are exactly data.prepare=ahead's, in the same order.
    """

    def __init__(self, records: list[dict], tokenizer: Tokenizer, seq_length: int):
        self.records = records
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(tokenizer)
        self.lengths = [len(tokenize(r, tokenizer)[0]) for r in records]
        self.plan = BlockPlan.of(self.lengths, seq_length)
        self.dropped = self.plan.dropped

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        examples = (tokenize(self.records[r], self.tokenizer) for r in self.plan.examples[i])
        ids, labels, positions = build_block(examples, self.plan.seq_length, self.pad_id)
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(positions, dtype=torch.long),
        }

    def position_ids(self) -> torch.Tensor:
        """Every block's position ids, from the token counts alone (nothing is tokenised again)."""
        seq = self.plan.seq_length
        rows = []
        for block in self.plan.examples:
            row = [p for r in block for p in range(self.lengths[r])]
            rows.append(row + list(range(seq - len(row))))
        return torch.tensor(rows, dtype=torch.long)


BlockDataset = PackedDataset | OnTheFlyDataset


def load_dataset(config: ConfigSchema, tokenizer: Tokenizer) -> BlockDataset:
    """The blocks a torch-backend run trains on, prepared as data.prepare says."""
    if config.data.prepare == "ahead":
        return PackedDataset(load_blocks(config, tokenizer))
    records = load_records(config.data, config.seed, config.train.seq_length, tokenizer)
    return OnTheFlyDataset(records, tokenizer, config.train.seq_length)


def make_dataloader(
    dataset: BlockDataset,
    batch_size: int,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    prefetch_factor: int | None,
    persistent_workers: bool,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """Shuffled micro-batches; with several ranks each rank reads its own share of the blocks."""
    sampler: DistributedSampler[int] | None = (
        DistributedSampler(dataset, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        if world_size > 1
        else None
    )
    per_rank = len(sampler) if sampler is not None else len(dataset)
    if per_rank < batch_size:
        # drop_last leaves no batch, and endless() would wait for one forever.
        raise ValueError(
            f"train.micro_batch_size={batch_size}: the data packs into {len(dataset)} block(s) of train.seq_length "
            f"tokens ({per_rank} per rank), fewer than one micro-batch, so no step can run; accepted: at most "
            f"{per_rank}, or more data (data.num_examples, data.path) or a shorter train.seq_length"
        )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=persistent_workers and num_workers > 0,
    )


def endless(loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """Cycle through epochs so a run lasts `max_steps` whatever the data size."""
    while True:
        yield from loader


class CapturedBlocks:
    """The micro-batches a run trains, step by step, with a capture window that follows the measurement
    (capture.start_step=auto) training the run's first blocks again.

    Where such a window falls depends on when the measurement stopped, so two runs would otherwise profile
    different blocks, and with document masking attention's work moves with the documents: on one H200 the
    7B shape's attention took 12.3-25.2 ms a captured step as a block held 73-221 tiles of 128 x 128
    (tests/data/profiles/h200_7b_repeats; docs/gpu.md). Training the same blocks in every run's window
    makes two runs' profiles, and their step delta, compare kernels on the same data. A window that begins
    before the first blocks are all trained trains the blocks as they come. `fingerprint` names the
    captured blocks (their tokens), so that a delta can tell whether two runs captured the same ones.
    """

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], steps: int, replay: bool):
        self._batches, self._steps, self._replay = batches, steps, replay
        self._first: list[dict[str, torch.Tensor]] = []
        self._captured = hashlib.sha1()
        self._captured_steps = 0

    def batch(self, step: int, window: range | None) -> dict[str, torch.Tensor]:
        """The host batch of `step`, given the capture window as it stands (None: not yet known)."""
        if window is None or step not in window:
            return self._next()
        replayed = self._replay and window.start >= self._steps
        batch = self._first[step - window.start] if replayed else self._next()
        self._captured.update(batch["input_ids"].numpy().tobytes())
        self._captured_steps += 1
        return batch

    def _next(self) -> dict[str, torch.Tensor]:
        batch = next(self._batches)
        if len(self._first) < self._steps:
            self._first.append(batch)
        return batch

    @property
    def fingerprint(self) -> str | None:
        """A short hash of the captured steps' tokens; None where no step was captured."""
        return self._captured.hexdigest()[:12] if self._captured_steps else None
