"""What follows each worker of a local sweep runs on one sweep thread, in order, while the next
combination starts; the next worker waits for it before its first measured step; every follow-up is
done before the launcher returns, also when the sweep is interrupted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest

from ghsweep.core.run_dir import MEASURE_AFTER, METRICS, SUMMARY
from ghsweep.launch import followups
from tests.support.compose import compose_config
from tests.support.planned_run import planned_run


def test_followups_run_in_order_on_one_sweep_thread_while_the_caller_goes_on():
    done: list[tuple[int, str]] = []
    release = threading.Event()
    with followups.overlapped():
        followups.run(lambda: (release.wait(10), done.append((0, threading.current_thread().name))))
        followups.run(lambda: done.append((1, threading.current_thread().name)))
        assert done == []  # the caller went on while the first one waits
        release.set()
    assert done == [(0, "ghsweep-followups"), (1, "ghsweep-followups")]


def test_outside_a_sweep_a_followup_runs_at_once_and_makes_no_marker(tmp_path):
    done = []
    followups.run(lambda: done.append(threading.current_thread()))
    assert done == [threading.current_thread()]
    assert followups.measure_after(tmp_path / MEASURE_AFTER) is None


def test_a_followup_that_must_run_alone_waits_for_those_before_it_and_runs_in_the_caller():
    done: list[str] = []
    with followups.overlapped():
        followups.run(lambda: (time.sleep(0.5), done.append("analysis of #0")))
        followups.run(lambda: done.append(f"ncu pass of #1 in {threading.current_thread().name}"), alone=True)
        assert done == ["analysis of #0", f"ncu pass of #1 in {threading.current_thread().name}"]


def test_the_marker_is_made_once_the_followups_before_it_are_done(tmp_path):
    marker = tmp_path / MEASURE_AFTER
    marker.touch()  # an interrupted attempt's, in the same run directory
    release = threading.Event()
    with followups.overlapped():
        followups.run(lambda: release.wait(10))
        assert followups.measure_after(marker) == marker
        assert not marker.exists()
        release.set()
    assert marker.exists()


def test_an_interrupted_sweep_still_runs_every_followup_and_one_that_fails_stops_none():
    done = []

    def failing() -> None:
        raise RuntimeError("MLflow went away")

    with pytest.raises(KeyboardInterrupt):
        with followups.overlapped():
            followups.run(lambda: (time.sleep(0.3), done.append("record #0")))
            followups.run(failing)
            followups.run(lambda: done.append("record #2 (killed)"))
            raise KeyboardInterrupt
    assert done == ["record #0", "record #2 (killed)"]


def test_the_next_worker_waits_for_the_sweep_before_its_measured_steps_and_no_step_holds_the_wait(tmp_path):
    """A real worker on the CPU, its plan's measure_after made 3 s after it says it waits: it trains
    the steps before its first measured or profiled one (its profiler's window starts at step 1, inside
    the warm-up), waits, then trains the rest; the wait is in none of its step times."""
    cfg = compose_config(
        "experiment=smoke",
        "precision=fp32",
        "train.max_steps=6",
        "train.warmup_steps=2",
        "train.seq_length=64",
        "train.log_every=1",
        "profile=torch",
        "capture.start_step=1",
        "capture.num_steps=2",
    )
    marker = tmp_path / MEASURE_AFTER
    plan = planned_run(tmp_path, cfg, profiler="torch")
    dataclasses.replace(plan, measure_after=str(marker)).save(tmp_path)
    worker = subprocess.Popen(
        [sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    before = []
    while (line := worker.stdout.readline()) and not line.startswith("ghsweep: waiting for the sweep's work"):
        before.append(line)
    assert line, "".join(before)[-3000:]  # the worker ended without waiting
    assert [x.split()[1] for x in before if x.startswith("step ")] == ["1/6"], before  # step 0 alone, unprofiled
    time.sleep(3)
    marker.touch()
    output, _ = worker.communicate(timeout=300)
    assert worker.returncode == 0, "".join(before) + output[-3000:]
    waited = float(output.split("ghsweep: waited ")[1].split(" s")[0])
    assert waited >= 3
    steps = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(6))
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["metrics"]["steps"] == 6
    # The loop's time holds the wait; its steps' times do not (a step that held it would leave no gap).
    outside_steps_s = summary["timing"]["train_s"] - sum(s["step_time_ms"] for s in steps) / 1000
    assert outside_steps_s >= 0.9 * waited, (outside_steps_s, waited)
