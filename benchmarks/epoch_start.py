"""How long the training loop waits for the first batch of each epoch, when the data loader's workers
start again (dataloader.persistent_workers=false) and when they are kept (true): the 7B line's data
(model=llama2_7b train.seq_length=4096, micro-batch 1, dataloader=default's 2 workers), on one rank and
as rank 0 of two. No model, no GPU; each batch is followed by STEP_MS of sleep, as a step's host work
that lets the workers read ahead. Prints a table last and writes OUT/epoch_start.json; run from the
repository root:

    OUT=results python3 benchmarks/epoch_start.py [EPOCHS]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from ghsweep.config.validate import validate
from ghsweep.train import dolly_data as dolly
from ghsweep.train.tokenizer import load_tokenizer

OVERRIDES = ("model=llama2_7b", "train.seq_length=4096", "train.micro_batch_size=1")
STEP_MS = 20


def measure(dataset: dolly.BlockDataset, persistent: bool, world_size: int, epochs: int) -> dict:
    loader = dolly.make_dataloader(
        dataset,
        batch_size=1,
        seed=0,
        num_workers=2,
        pin_memory=False,
        prefetch_factor=2,
        persistent_workers=persistent,
        world_size=world_size,
    )
    per_epoch = len(loader)
    read = dolly.endless(loader)
    waits_ms = []
    for _ in range(epochs * per_epoch + 1):
        started = time.perf_counter()
        next(read)
        waits_ms.append(1000 * (time.perf_counter() - started))
        time.sleep(STEP_MS / 1000)
    epoch_starts = [waits_ms[k * per_epoch] for k in range(1, epochs + 1)]
    return {
        "persistent_workers": persistent,
        "world_size": world_size,
        "batches_per_epoch": per_epoch,
        "first_batch_ms": waits_ms[0],
        "epoch_start_ms": epoch_starts,
        "median_wait_ms": statistics.median(w for i, w in enumerate(waits_ms) if i % per_epoch),
    }


def main() -> None:
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base="1.3"):
        config = validate(compose("config", overrides=list(OVERRIDES)), None)
    dataset = dolly.load_dataset(config, load_tokenizer(config))
    rows = [measure(dataset, persistent, world, epochs) for persistent in (False, True) for world in (1, 2)]
    out = Path(os.environ.get("OUT", "results"))
    out.mkdir(parents=True, exist_ok=True)
    result = {"command": "python3 benchmarks/epoch_start.py", "cpus": os.cpu_count(), "step_ms": STEP_MS, "rows": rows}
    (out / "epoch_start.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| persistent_workers | ranks | batches an epoch | wait at each epoch's start (ms) | median wait (ms) |")
    print("|---|---|---|---|---|")
    for r in rows:
        starts = ", ".join(f"{ms:.1f}" for ms in r["epoch_start_ms"])
        print(
            f"| {str(r['persistent_workers']).lower()} | {r['world_size']} | {r['batches_per_epoch']} | {starts} "
            f"| {r['median_wait_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
