"""The torch backend's data loader alone, data.prepare=ahead against on_the_fly, at dataloader.num_workers 0
and 2: the 7B presets' data (2,000 synthetic dolly records, blocks of 4,096 tokens, micro-batch 1) with the
bpe tokenizer both ways, so both read the same blocks. No model, no GPU: what the loader delivers per second,
and what preparing takes before the first batch. Prints a table last and writes OUT/data_prepare.json; run
from the repository root:

    OUT=results python3 benchmarks/data_prepare.py [BATCHES]

Each row reads BATCHES batches (default 100) after the first, which waits for the workers to start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from ghsweep.config.validate import validate
from ghsweep.train import dolly_data as dolly
from ghsweep.train.tokenizer import load_tokenizer

OVERRIDES = ("model=llama2_7b", "data.num_examples=2000", "train.seq_length=4096", "train.micro_batch_size=1")


def measure(prepare: str, workers: int, batches: int) -> dict:
    with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base="1.3"):
        composed = compose("config", overrides=[*OVERRIDES, f"data.prepare={prepare}", "data.tokenizer=bpe"])
    config = validate(composed, None)
    tokenizer = load_tokenizer(config)
    started = time.perf_counter()
    dataset = dolly.load_dataset(config, tokenizer)
    prepared_s = time.perf_counter() - started
    loader = dolly.make_dataloader(
        dataset,
        config.train.micro_batch_size,
        seed=config.seed,
        num_workers=workers,
        pin_memory=False,
        prefetch_factor=2 if workers else None,
        persistent_workers=False,
    )
    batch_tokens = config.train.micro_batch_size * config.train.seq_length
    read = dolly.endless(loader)
    next(read)  # the workers start and fill their prefetch queue
    started = time.perf_counter()
    for _ in range(batches):
        next(read)
    elapsed = time.perf_counter() - started
    return {
        "prepare": prepare,
        "num_workers": workers,
        "prepare_s": prepared_s,
        "blocks": len(dataset),
        "batches": batches,
        "batches_per_s": batches / elapsed,
        "tokens_per_s": batches * batch_tokens / elapsed,
        "ms_per_batch": 1000 * elapsed / batches,
    }


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    out = Path(os.environ.get("OUT", "results"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [measure(prepare, workers, batches) for prepare in ("ahead", "on_the_fly") for workers in (0, 2)]
    (out / "data_prepare.json").write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    cpus = os.cpu_count()
    print(f"| data.prepare | num_workers | prepare before the first batch (s) | ms a batch | tokens/s ({cpus} CPUs) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['prepare']} | {r['num_workers']} | {r['prepare_s']:.2f} | {r['ms_per_batch']:.2f} "
            f"| {r['tokens_per_s']:,.0f} |"
        )


if __name__ == "__main__":
    main()
