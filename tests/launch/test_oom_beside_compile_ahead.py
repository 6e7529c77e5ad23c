"""A run that ran out of GPU memory while the sweep's compile-ahead workers trained on its GPU is run
again once, alone, after they have ended; an out-of-memory with nothing of the sweep beside it stays
the combination's own failure. The job's retry loop runs for real, its second attempt with the real
worker on the smoke model; the first attempt's worker is a small program that fails as torch does on
a GPU out of memory (worker_error.json), which no CPU can make torch do."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

import pytest

from ghsweep.core.run_dir import WORKER_ERROR
from ghsweep.launch import followups, job
from tests.support.combinations import combination, failed_result
from tests.support.compose import compose_config

# The trainer's worker is a process of its own (tests/support/tiers.py cannot see it).
pytestmark = pytest.mark.cli

OUT_OF_MEMORY = f"""
import json, pathlib, sys
pathlib.Path(sys.argv[1], {WORKER_ERROR!r}).write_text(json.dumps(
    {{"type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2.00 GiB"}}))
sys.exit(1)
"""


def first_attempts_run_out_of_memory(monkeypatch, how_many: int) -> tuple[list[float], threading.Event]:
    """Make the job's first `how_many` workers fail out of GPU memory; return when each worker started,
    and an event set as the first one starts."""
    started: list[float] = []
    first_started = threading.Event()
    real_prepare = job.prepare_worker

    def prepare(cfg, combo, slurm_tasks, measure_after=None):
        plan, config = real_prepare(cfg, combo, slurm_tasks, measure_after)
        started.append(time.time())
        first_started.set()
        if len(started) <= how_many:
            plan = dataclasses.replace(plan, worker_command=[sys.executable, "-c", OUT_OF_MEMORY, str(combo.run_dir)])
        return plan, config

    monkeypatch.setattr(job, "prepare_worker", prepare)
    return started, first_started


def compile_ahead_beside(first_started: threading.Event, seconds: float) -> tuple[threading.Thread, list[float]]:
    """A follow-up on the GPU, as compile_ahead's workers are, until `seconds` after the first attempt
    started (so a slow machine cannot end it before that attempt); the list gets when it ended."""
    ended: list[float] = []

    def on_gpu() -> None:
        with followups.on_the_gpu():
            first_started.wait()
            time.sleep(seconds)
            ended.append(time.time())  # inside: the job can only see it ended after this

    thread = threading.Thread(target=on_gpu)
    thread.start()
    return thread, ended


def train(tmp_path: Path):
    combo = combination(tmp_path / "0")
    result = failed_result(combo)
    cfg = compose_config("experiment=smoke", "profile=none", "train.max_steps=2", "train.warmup_steps=1")
    job.train_with_retries(cfg, combo, result, slurm_tasks=None, store=None)
    return combo, result


def test_an_out_of_memory_beside_compile_ahead_workers_is_run_again_once_they_have_ended(tmp_path, monkeypatch, caplog):
    started, first_started = first_attempts_run_out_of_memory(monkeypatch, 1)
    thread, ended = compile_ahead_beside(first_started, 3.0)
    with caplog.at_level("WARNING", logger=job.__name__):
        combo, result = train(tmp_path)
    thread.join()
    reason = f"OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB {job.BESIDE_COMPILE_AHEAD}"
    assert (result.status, result.attempts, result.error) == ("FINISHED", [reason], None)
    assert len(started) == 2 and started[1] >= ended[0]  # the second attempt ran alone
    assert "running it again (alone, once they have ended)" in caplog.text
    assert (combo.run_dir / "worker.attempt1.log").exists()
    assert result.metrics["tokens_per_s"] > 0  # the real worker trained


def test_a_second_out_of_memory_beside_them_or_one_alone_is_the_combinations_own(tmp_path, monkeypatch):
    started, first_started = first_attempts_run_out_of_memory(monkeypatch, 2)
    thread, _ = compile_ahead_beside(first_started, 0.5)
    combo, result = train(tmp_path / "beside")
    thread.join()
    # Run again once; the attempt alone ran out of memory too: the combination's own, not run a third time.
    assert (result.status, result.failure_class, len(result.attempts), len(started)) == (
        "FAILED",
        "deterministic",
        1,
        2,
    )
    assert result.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"

    started.clear()
    combo, result = train(tmp_path / "alone")  # nothing of the sweep on the GPU
    assert (result.status, result.failure_class, result.attempts, len(started)) == ("FAILED", "deterministic", [], 1)
