"""A run whose loss becomes NaN or infinite ends FAILED at that step with one line, and the sweep goes on.

The diverging run is a real one: full fine-tuning in fp16 at a learning rate of 0.9 without
gradient clipping overflows fp16 within a few steps (the tiny model's loss is NaN by the third to fifth step).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from ghsweep.core.errors import NonFiniteLoss
from ghsweep.train.step_log import StepLog
from tests.conftest import MlflowRecords, run_cli, sqlite_uri

DIVERGING = ["peft=none", "precision=fp16", "train.grad_clip=null", "train.lr_schedule=constant", "train.max_steps=10"]


def test_flush_stops_at_the_first_non_finite_loss(tmp_path):
    log = StepLog(tmp_path / "metrics.jsonl", torch.device("cpu"), tokens_per_step=64)
    for step, loss in enumerate([2.0, 1.5, math.inf, math.nan]):
        log.end(step, torch.tensor(loss), log.start())
    with pytest.raises(NonFiniteLoss, match=r"^loss became inf at step 3$"):
        log.flush()
    log.close()
    # The steps up to the bad one are on record; the step after it is not.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


@pytest.fixture(scope="module")
def diverging_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("diverging")
    proc = run_cli(["-m", *DIVERGING, "train.lr=0.9,0.0001"], cwd)
    return cwd, proc


def test_diverging_run_fails_at_its_step_and_the_sweep_goes_on(diverging_sweep):
    cwd, proc = diverging_sweep
    runs = {r.data.params["train.lr"]: r for r in MlflowRecords(sqlite_uri(cwd)).runs("run")}
    assert set(runs) == {"0.9", "0.0001"}, proc.stderr[-3000:]
    diverged, fine = runs["0.9"], runs["0.0001"]
    assert diverged.data.tags["ghsweep.status"] == "FAILED"
    bad_step = re.fullmatch(r"NonFiniteLoss: loss became nan at step (\d+)", diverged.data.tags["ghsweep.error"])
    assert bad_step, diverged.data.tags["ghsweep.error"]
    assert fine.data.tags["ghsweep.status"] == "FINISHED"
    assert math.isfinite(fine.data.metrics["final_loss"])
    # Its losses up to the bad step are recorded, the bad one last.
    history = MlflowRecords(sqlite_uri(cwd)).client.get_metric_history(diverged.info.run_id, "loss")
    assert [m.step for m in history] == list(range(int(bad_step[1]))) and math.isnan(history[-1].value)
    assert all(math.isfinite(m.value) for m in history[:-1])
