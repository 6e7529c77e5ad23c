"""The worker process as the job starts it: it trains what run_plan.json and config.yaml say, writes
summary.json, metrics.jsonl and the torch trace, records its failure in worker_error.json, and loads
nothing of the launch side, the config validation, the profile planning, the profile analysis or
matplotlib."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ghsweep.capture.torch_capture import torch_capture
from ghsweep.core.run_dir import METRICS, SUMMARY, TORCH_TRACE, WORKER_ERROR, WORKER_LOG
from ghsweep.core.run_plan import ProfilePlan
from ghsweep.core.run_result import SETUP_PARTS
from ghsweep.launch.worker_process import run_worker as run_worker_process
from ghsweep.launch.worker_process import worker_pid
from ghsweep.train.step_log import StepLog
from tests.support.compose import compose_config
from tests.support.planned_run import planned_run
from tests.support.processes import live_group_members

# Runs the worker as `python -m` would, then prints which of these modules it loaded.
NOT_FOR_THE_WORKER = (
    "ghsweep.launch",
    "ghsweep.config.validate",
    "ghsweep.config.parallelism",
    "ghsweep.config.keys",
    "ghsweep.capture.profiler_plan",
    "ghsweep.profile",
    "ghsweep.report",
    "ghsweep.tracking",
    "matplotlib",
)
# The worker ends through os._exit (or sys.exit under a CUDA tool): both print what it loaded first.
WORKER = f"""
import json, os, runpy, sys
def print_loaded():
    loaded = sorted({{m for m in sys.modules for p in {NOT_FOR_THE_WORKER!r} if m == p or m.startswith(p + ".")}})
    print("LOADED " + json.dumps(loaded), flush=True)
exit_process, worker_pid = os._exit, os.getpid()
# Forked children (data-loader workers) inherit this hook: only the worker itself prints.
os._exit = lambda code: (os.getpid() == worker_pid and print_loaded(), exit_process(code))
sys.argv = ["ghsweep.train.worker", sys.argv[1]]
try:
    runpy.run_module("ghsweep.train.worker", run_name="__main__")
except SystemExit:
    print_loaded()
    raise
"""


def run_worker(run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WORKER, str(run_dir)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=600,
    )


def loaded(proc: subprocess.CompletedProcess) -> list[str]:
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("LOADED "))[7:])


def test_the_worker_trains_the_planned_run_and_loads_only_training(tmp_path):
    cfg = compose_config(
        "experiment=smoke",
        "train.max_steps=3",
        "train.log_every=2",
        "train.seq_length=64",
        "train.warmup_steps=1",
        "capture.start_step=1",
        "capture.num_steps=1",
    )
    planned_run(tmp_path, cfg, profiler="torch")
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert loaded(proc) == []
    assert [line.split(" loss")[0] for line in proc.stdout.splitlines() if line.startswith("step ")] == [
        "step 2/3",
        "step 3/3",
    ]
    rows = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["tokens"] == 64 for r in rows)
    summary = json.loads((tmp_path / SUMMARY).read_text())
    # Step 0 is the warm-up, step 1 the profiler's: one steady step, too few for an interval.
    assert summary["metrics"]["steps"] == 3 and summary["metrics"]["steady_steps"] == 1
    assert summary["metrics"]["excluded_steps"] == 1 and "tokens_per_s_ci_low" not in summary["metrics"]
    assert summary["info"]["measure_stop"] == "max_steps"  # train.measure=auto: a fixed length on CPU
    assert summary["metrics"]["final_loss"] == rows[-1]["loss"]
    assert summary["metrics"]["world_size"] == 1
    assert summary["metrics"]["tokens_per_s_per_gpu"] == summary["metrics"]["tokens_per_s"]
    timing = summary["timing"]
    assert timing["ready_at"] <= timing["setup_at"] and timing["import_s"] == timing["setup_at"] - timing["ready_at"]
    assert timing["setup_s"] > 0 and timing["train_s"] > 0
    # The set-up's parts, timed one after the other inside it.
    parts = [timing[part] for part in SETUP_PARTS]
    assert all(p >= 0 for p in parts) and timing["model_s"] > 0 and sum(parts) <= timing["setup_s"]
    # No cudaProfilerStart/Stop on a CPU, and nothing compiled: neither took any of the loop's time.
    assert timing["capture_s"] == 0.0 and timing.get("compile_s", 0.0) == 0.0
    assert summary["info"]["device"] == "cpu" and summary["info"]["data_parallel"] == "none"
    assert summary["info"]["compiled"] is False and summary["info"]["offload_applied"] is False
    # The plan said torch: the PyTorch profiler traced the capture window (step 1).
    trace = json.loads((tmp_path / TORCH_TRACE).read_text())
    assert any(e.get("name") == "step 1" for e in trace["traceEvents"])
    assert not any(e.get("name") in ("step 0", "step 2") for e in trace["traceEvents"])
    assert not (tmp_path / WORKER_ERROR).exists()
    # Python's own collections, timed in the measured steps whether any ran or not.
    assert {"gc_pause_ms_per_step", "gc_pause_max_ms", "gc_full_collections"} <= summary["metrics"].keys()


def test_gc_interval_collects_the_young_generations_in_the_steps_it_names(tmp_path):
    cfg = compose_config(
        "experiment=smoke", "train.max_steps=4", "train.seq_length=64", "train.warmup_steps=1", "train.gc_interval=1"
    )
    planned_run(tmp_path, cfg, profiler="none")
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    metrics = json.loads((tmp_path / SUMMARY).read_text())["metrics"]
    # A collection at the end of every step, timed; automatic ones (the oldest generation's among them) off.
    assert metrics["gc_pause_ms_per_step"] > 0 and metrics["gc_pause_max_ms"] > 0
    assert metrics["gc_full_collections"] == 0


# A run measuring past its 6 steps to a budget of 12: its interval target is narrower than a CPU can
# measure, so the step budget ends it unless something else does.
MEASURING_TO_A_BUDGET = (
    "experiment=smoke",
    "train.max_steps=6",
    "train.log_every=3",
    "train.seq_length=64",
    "train.measure=true",
    "train.measure_ci_pct=0.001",
    "train.measure_max_steps=12",
)


def test_a_measuring_run_trains_on_until_its_budget_and_records_its_interval(tmp_path):
    cfg = compose_config(*MEASURING_TO_A_BUDGET)
    planned_run(tmp_path, cfg, profiler="none")
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    m = summary["metrics"]
    assert summary["info"]["measure_stop"] == "step_budget" and m["steps"] == 12
    progress = [line.split(" loss")[0] for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert progress == [
        "step 3/6",
        "step 6/6",
        "step 9 (measuring past train.max_steps=6)",
        "step 12 (measuring past train.max_steps=6)",
    ]
    assert len((tmp_path / METRICS).read_text().splitlines()) == 12
    assert (
        m["steady_steps"] + m["warmup_steps_detected"] + m["excluded_steps"] == 12 and m["warmup_steps_detected"] >= 3
    )
    assert m["step_time_ms_ci_low"] <= m["step_time_ms"] <= m["step_time_ms_ci_high"]
    assert m["tokens_per_s_ci_low"] <= m["tokens_per_s"] <= m["tokens_per_s_ci_high"]
    assert m["step_time_ms_ci_pct"] > 0.001


def traced_steps(run_dir: Path) -> list[int]:
    """The steps the run's torch trace holds (its `step N` ranges)."""
    events = json.loads((run_dir / TORCH_TRACE).read_text())["traceEvents"]
    return sorted({int(e["name"].split()[1]) for e in events if re.fullmatch(r"step \d+", e.get("name", ""))})


@pytest.mark.parametrize(
    ("measure", "steps", "traced"),
    [
        # A fixed length: the run's last 2 steps, right after its measured ones.
        ("false", 6, [4, 5]),
        # A length train.measure decides (here its budget of 12): 2 more steps once it has stopped.
        ("true", 14, [12, 13]),
    ],
)
def test_capture_auto_records_the_steps_right_after_the_measured_ones(tmp_path, measure, steps, traced):
    cfg = compose_config(*MEASURING_TO_A_BUDGET, f"train.measure={measure}", "capture.num_steps=2")
    assert cfg.capture.start_step == "auto"  # the default
    planned_run(tmp_path, cfg, profiler="torch")
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    m = summary["metrics"]
    assert m["steps"] == steps and len((tmp_path / METRICS).read_text().splitlines()) == steps
    assert traced_steps(tmp_path) == traced
    # The traced steps are out of the steady set; every step before them is warm-up or measured.
    assert m["excluded_steps"] == 2 and m["steady_steps"] + m["warmup_steps_detected"] == traced[0]


def test_every_auto_window_profiles_the_same_blocks_wherever_the_measurement_ends_it(tmp_path):
    """Windows at steps 4-5 (a fixed length) and 12-13 (after measuring to a budget) train the run's first
    two blocks again, so both runs profile the same data; a window at a chosen step trains its own."""
    captured = {}
    for name, overrides in {
        "fixed": ["train.measure=false"],
        "measured": ["train.measure=true"],
        "chosen": ["train.measure=false", "capture.start_step=2"],
    }.items():
        run_dir = tmp_path / name
        planned_run(run_dir, compose_config(*MEASURING_TO_A_BUDGET, *overrides, "capture.num_steps=2"), "torch")
        proc = run_worker(run_dir)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        captured[name] = json.loads((run_dir / SUMMARY).read_text())["info"]["captured_blocks"]
    assert captured["fixed"] == captured["measured"] != captured["chosen"]


@pytest.mark.parametrize(("bar", "stop"), [(1e12, "pruned"), (1.0, "step_budget")])
def test_a_measuring_trial_stops_early_only_when_it_is_slower_than_the_bar(tmp_path, bar, stop):
    """tune.prune: a bar no CPU reaches stops the run at the first flush whose interval is known; a
    bar every run beats leaves it to its step budget."""
    cfg = compose_config(*MEASURING_TO_A_BUDGET, f"+tune.prune_below_tokens_per_s={bar}")
    planned_run(tmp_path, cfg, profiler="none")
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / SUMMARY).read_text())
    m = summary["metrics"]
    assert summary["info"]["measure_stop"] == stop
    if stop == "pruned":  # past the minimum, as soon as an interval says it is slower
        assert 6 <= m["steps"] < 12 and m["tokens_per_s_ci_high"] < bar
    else:
        assert m["steps"] == 12


def test_a_worker_that_fails_says_why_in_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    proc = run_worker(tmp_path, RANK="1")
    assert proc.returncode == 1
    error = json.loads((tmp_path / WORKER_ERROR).read_text())
    assert error["type"] == "FileNotFoundError"
    assert error["message"].startswith("rank 1: ") and "run_plan.json" in error["message"]
    assert not (tmp_path / SUMMARY).exists()
    assert loaded(proc) == []


def test_a_failing_loop_still_closes_the_trace_and_the_step_log(tmp_path):
    """The loop's context managers close on the way out of a failure: the trace of the steps that ran is
    written, and metrics.jsonl keeps the rows flushed before it."""
    cpu = torch.device("cpu")
    profiled = ProfilePlan(requested="torch", used="torch")
    with pytest.raises(RuntimeError, match="step 1 failed"):
        with StepLog(tmp_path / METRICS, cpu, 8) as log, torch_capture(profiled, tmp_path, cpu, range(3)) as profiler:
            for step in range(3):
                profiler.step(step)
                with torch.profiler.record_function(f"step {step}"):
                    log.end(step, torch.tensor(float(step)), log.start())
                    if step == 1:
                        raise RuntimeError("step 1 failed")
                log.flush_due(step + 1, 3, 1, progress=False)
    assert [json.loads(line)["step"] for line in (tmp_path / METRICS).read_text().splitlines()] == [0]
    names = {e.get("name") for e in json.loads((tmp_path / TORCH_TRACE).read_text())["traceEvents"]}
    assert {"step 0", "step 1"} <= names


def test_a_failure_replaces_an_earlier_attempts_error_but_not_another_ranks(tmp_path):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    error_file = tmp_path / WORKER_ERROR
    # An earlier attempt in the same run directory (hydra.run.dir fixed, the run started again).
    error_file.write_text(json.dumps({"type": "OutOfMemoryError", "message": "CUDA out of memory"}))
    os.utime(error_file, (0, 0))
    assert run_worker(tmp_path).returncode == 1
    assert json.loads(error_file.read_text())["type"] == "FileNotFoundError"
    # Another rank of this attempt, started before that file was written (its mtime set past this
    # worker's start), fails later and keeps the first rank's reason.
    later = time.time() + 600
    os.utime(error_file, (later, later))
    assert run_worker(tmp_path, RANK="1").returncode == 1
    assert not json.loads(error_file.read_text())["message"].startswith("rank 1: ")
    assert not list(tmp_path.glob(".worker_error.*"))


@pytest.mark.cli  # the worker starts processes
def test_nothing_the_worker_started_outlives_its_run(tmp_path):
    # The worker skips the interpreter's teardown (seconds): what it started (persistent data-loader
    # workers, Inductor's compile pool) shares its log pipe, and the job ends it with the worker.
    cfg = compose_config(
        "experiment=smoke", "train.max_steps=2", "train.seq_length=64", "dataloader.persistent_workers=true"
    )
    planned_run(tmp_path, cfg)
    exit = run_worker_process([sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)], tmp_path, timeout_s=600)
    assert exit.returncode == 0, (tmp_path / WORKER_LOG).read_text()[-3000:]
    assert live_group_members(worker_pid(tmp_path)) == []
    assert json.loads((tmp_path / SUMMARY).read_text())["metrics"]["steps"] == 2
