"""How one combination's job ends when something goes wrong, step by step and in seconds: a config
the node refuses, a worker that crashes, is killed, hangs or leaves a SLURM rank failed, and an
MLflow store that breaks before the record. The job's own functions run for real: a real worker
process (a small program standing in for the trainer, keeping its contract: worker_error.json,
summary.json, exit status), real run files and a real SQLite MLflow store. The full CLI paths are
in tests/reliability."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ghsweep.core.names import ROLE_RUN, ROLE_TAG
from ghsweep.core.run_dir import CONFIG, REPORT, RUN_PLAN, WORKER_ERROR, WORKER_LOG
from ghsweep.core.run_plan import RunPlan, World
from ghsweep.core.run_result import RunResult
from ghsweep.core.run_summary import RunSummary
from ghsweep.launch.job import Trained, analyse, measure, record, start_run, timeout_s, train_and_measure
from ghsweep.launch.run_planner import node_plan
from ghsweep.launch.slurm.rank_reports import write_rank_report
from ghsweep.launch.worker_process import run_worker
from ghsweep.profile.pipeline import ProfileOutcome
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.combinations import combination, failed_result
from tests.support.compose import compose_config, compose_typed

# The job's functions start a real worker process (tests/support/tiers.py cannot see it).
pytestmark = pytest.mark.cli


def test_a_config_the_node_refuses_fails_before_any_worker_with_one_line(tmp_path):
    combo = combination(tmp_path / "0")
    cfg = compose_config("experiment=smoke", "train.max_steps=0")
    result = failed_result(combo)
    trained = train_and_measure(cfg, combo, result, slurm_tasks=None)
    assert (result.status, result.error) == ("FAILED", "train.max_steps=0: must be an integer >= 1")
    assert trained == Trained()  # no summary, no profile to analyse, no interrupt
    # The job said it was running before it checked anything, and the worker's input is there to read.
    assert RunResult.load(combo.run_dir).status == "RUNNING"
    assert (combo.run_dir / CONFIG).exists()
    assert not (combo.run_dir / WORKER_LOG).exists() and not (combo.run_dir / RUN_PLAN).exists()


def test_a_config_on_a_slurm_job_of_the_wrong_size_is_refused_on_every_rank(tmp_path):
    combo = combination(tmp_path / "0")
    result = failed_result(combo)
    train_and_measure(compose_config("experiment=smoke", "backend.gpus_per_node=2"), combo, result, slurm_tasks=3)
    assert result.error.startswith(
        "backend.num_nodes x backend.gpus_per_node = 2 ranks, but this SLURM job has 3 tasks"
    )


def planned_worker(tmp_path: Path, program: str, *overrides: str) -> RunPlan:
    """The job's plan on a CPU node, its worker replaced by `program` (Python source) run the same way."""
    run_dir = tmp_path / "0"
    run_dir.mkdir(exist_ok=True)
    plan, _ = node_plan(compose_config("experiment=smoke", "profile=none", *overrides), run_dir, "run", [], None, None)
    return dataclasses.replace(plan, worker_command=[sys.executable, "-c", program, str(run_dir)])


def run_planned(plan: RunPlan) -> RunResult:
    """The job's steps after planning: run the worker as planned, measure how it ended, and analyse
    the profile of a finished one."""
    run_dir = Path(plan.run_dir)
    combo = combination(run_dir)
    result = failed_result(combo)
    exit = run_worker(plan.worker_command, run_dir, timeout_s(plan))
    summary = measure(plan, exit, result)
    if result.status == "FINISHED":
        analyse(Trained(summary, (compose_typed("experiment=smoke", "profile=none"), plan)), combo, result)
    return result


WRITES_ERROR = f"""
import json, pathlib, sys
pathlib.Path(sys.argv[1], {WORKER_ERROR!r}).write_text(json.dumps({{"type": "OutOfMemoryError", "message": "CUDA out of memory"}}))
sys.exit(1)
"""


@pytest.mark.parametrize(
    "program, error",
    [
        (WRITES_ERROR, "OutOfMemoryError: CUDA out of memory"),
        (
            "print('loading'); print('segfault in a kernel'); raise SystemExit(3)",
            "worker exited with status 3: segfault in a kernel",
        ),
        (
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
            "worker killed by SIGKILL (killed from outside, often the out-of-memory killer)",
        ),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "worker killed by SIGSEGV"),
    ],
    ids=["worker_error.json", "exit status", "SIGKILL", "SIGSEGV"],
)
def test_a_worker_that_crashes_is_failed_with_its_reason(tmp_path, program, error):
    result = run_planned(planned_worker(tmp_path, program))
    assert (result.status, result.error, result.metrics) == ("FAILED", error, {})


def test_a_hanging_worker_is_killed_at_its_timeout(tmp_path):
    plan = planned_worker(
        tmp_path, "import time; print('step 1', flush=True); time.sleep(600)", "worker.timeout_min=0.01"
    )
    assert plan.timeout_min == 0.01
    result = run_planned(plan)
    assert (result.status, result.error) == (
        "FAILED",
        "worker timed out after 0.01 min (worker.timeout_min) and was killed",
    )
    assert (tmp_path / "0" / WORKER_LOG).read_text() == "step 1\n"


WRITES_SUMMARY = """
import json, pathlib, sys, time
# Set up 3 s ago, then trained 2 s: the loop ends now, and the worker takes a second more to exit.
summary = {"metrics": {"tokens_per_s": 10.0, "loss": 2.5}, "timing": {"ready_at": time.time(), "import_s": 0.5,
           "setup_at": time.time() - 3.0, "setup_s": 1.0, "train_s": 2.0, "compile_s": 0.75, "capture_s": 0.25},
           "info": {"device_name": "cpu"}}
pathlib.Path(sys.argv[1], "summary.json").write_text(json.dumps(summary))
time.sleep(1.0)
"""


def test_a_worker_that_finishes_while_a_slurm_rank_failed_fails_with_the_ranks_error(tmp_path):
    # Rank 0's task of a SLURM job of two tasks; srun started rank 1, which reported its failure.
    plan = dataclasses.replace(planned_worker(tmp_path, WRITES_SUMMARY), srun_ranks=True, world=World(1, 2))
    write_rank_report(Path(plan.run_dir), 1, "FAILED", "RuntimeError: NCCL timeout")
    result = run_planned(plan)
    assert (result.status, result.error) == ("FAILED", "rank 1: RuntimeError: NCCL timeout")


def test_a_worker_that_finishes_gives_its_metrics_and_where_the_time_went(tmp_path):
    result = run_planned(planned_worker(tmp_path, WRITES_SUMMARY))
    assert (result.status, result.error) == ("FINISHED", None)
    assert result.metrics == {"tokens_per_s": 10.0, "loss": 2.5}
    assert (result.timing["setup_s"], result.timing["train_s"]) == (1.0, 2.0)
    assert (result.timing["compile_s"], result.timing["capture_s"]) == (0.75, 0.25)  # parts of train_s
    assert result.timing["startup_s"] >= 0.5
    assert 1.0 <= result.timing["worker_exit_s"] < 5.0
    assert result.timing["analysis_s"] >= 0.0


def test_a_broken_mlflow_store_at_record_time_leaves_the_run_files_complete(tmp_path, caplog):
    combo = combination(tmp_path / "0")
    cfg = compose_config("experiment=smoke")
    db = tmp_path / "mlflow.db"
    store = MlflowStore(f"sqlite:///{db}", "ghsweep")
    run_id = start_run(store, cfg, combo, "hash-1", None)
    run = MlflowClient(f"sqlite:///{db}").get_run(run_id)
    assert (run.info.status, run.data.tags[ROLE_TAG], run.data.params["precision"]) == ("RUNNING", ROLE_RUN, "fp32")
    result = dataclasses.replace(failed_result(combo), mlflow_run_id=run_id, error="worker exited with status 1: boom")
    db.write_bytes(b"this is not a database" * 100)  # the store breaks between the start and the record

    record(store, run_id, cfg, combo.run_dir, result, RunSummary(), ProfileOutcome(), time.time())
    assert "the MLflow record is incomplete (" in caplog.text and "); the run's record is complete in" in caplog.text
    saved = RunResult.load(combo.run_dir)
    assert (saved.status, saved.error, saved.mlflow_run_id) == ("FAILED", "worker exited with status 1: boom", run_id)
    assert "wall_s" in saved.timing
    assert "worker exited with status 1: boom" in (combo.run_dir / REPORT).read_text()
