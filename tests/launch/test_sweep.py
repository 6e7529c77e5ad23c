"""The real CLI end to end: a sweep on CPU recorded in MLflow (SQLite store in a temp directory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ghsweep.core.names import NOTE_TAG
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, sqlite_uri
from tests.support.models import UNREADABLE_WEIGHTS_ERROR, unreadable_model

RUN_METRICS = {"loss", "step_time_ms", "tokens_per_s", "peak_mem_gb", "final_loss"}
RUN_PARAMS = {"precision", "offload", "peft", "memory", "dataloader.num_workers", "peft.r", "train.max_steps"}
RUN_TAGS = {"mlflow.source.git.commit", "ghsweep.host", "ghsweep.torch_version", "ghsweep.device_name"}
ARTIFACTS = {"config.yaml", "overrides.yaml", "worker.log", "report.md", "metrics.jsonl", "summary.json"}


def test_smoke_sweep_records_parent_and_four_children(smoke_sweep):
    cwd, proc = smoke_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = MlflowRecords(sqlite_uri(cwd))
    client = records.client
    parents = records.runs("sweep")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = records.runs("run")
    assert len(children) == 4
    combos = set()
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert RUN_METRICS <= set(child.data.metrics)
        assert RUN_PARAMS <= set(child.data.params)
        assert RUN_TAGS <= set(child.data.tags)
        assert child.data.metrics["step_time_ms"] > 0 and child.data.metrics["tokens_per_s"] > 0
        combos.add((child.data.params["precision"], child.data.params["offload"]))
        assert len(client.get_metric_history(child.info.run_id, "loss")) == 20
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert ARTIFACTS <= artifacts
    assert combos == {("fp32", "off"), ("fp32", "on"), ("bf16", "off"), ("bf16", "on")}


def test_the_mlflow_ui_names_the_knobs_that_differ_and_the_sweep_states_its_verdict(smoke_sweep):
    cwd, proc = smoke_sweep
    records = MlflowRecords(sqlite_uri(cwd))
    (parent,) = records.runs("sweep")
    names = {child.info.run_name for child in records.runs("run")}
    assert names == {f"precision={p} offload={o}" for p in ("fp32", "bf16") for o in ("off", "on")}
    note = parent.data.tags[NOTE_TAG]
    fastest, link = note.split("\n\n")
    assert fastest.startswith("**Fastest: ") and link.startswith("Pareto front: #"), note
    report = f"#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}/artifacts/comparison/comparison.html"
    assert link.endswith(f"[comparison/comparison.html]({report}?workflowType=machine_learning)")
    lines = proc.stdout.splitlines()
    at = lines.index("  MLflow: mlflow ui --backend-store-uri " + sqlite_uri(cwd))
    page = f"#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
    assert lines[at + 1] == f"    http://127.0.0.1:5000/{page}"


def test_smoke_sweep_ends_with_one_table_within_120_columns(smoke_sweep):
    cwd, proc = smoke_sweep
    out = proc.stdout
    assert "4 of 4 runs finished" in out
    end = out[out.index("4 of 4 runs finished") :]
    # One table: the comparison's; the summary's, with each run's reason whole, is in summary.md.
    assert [line for line in end.splitlines() if line.startswith("#  ")] == [
        next(line for line in end.split("ghsweep comparison:\n")[1].splitlines())
    ]
    assert max(len(line) for line in end.splitlines()) <= 120, end
    (summary,) = cwd.glob("multirun/*/*/summary.md")
    header = next(line for line in summary.read_text().splitlines() if line.startswith("#  "))
    for column in ("precision", "offload", "status", "step_ms", "tokens/s", "peak_GiB", "overhead_s", "reason"):
        assert column in header
    assert summary.read_text().count(" FINISHED ") == 4


def test_smoke_runs_write_their_run_directory(smoke_sweep):
    cwd, _ = smoke_sweep
    run_dirs = sorted(p.parent for p in cwd.glob("multirun/*/*/*/result.json"))
    assert len(run_dirs) == 4
    for run_dir in run_dirs:
        for name in ("config.yaml", "overrides.yaml", "worker.log", "metrics.jsonl", "summary.json", "report.md"):
            assert (run_dir / name).stat().st_size > 0, name
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(20))
        assert "Status: **FINISHED**" in (run_dir / "report.md").read_text()


def test_loss_goes_down(smoke_sweep):
    cwd, _ = smoke_sweep
    for metrics_file in cwd.glob("multirun/*/*/*/metrics.jsonl"):
        losses = [json.loads(line)["loss"] for line in metrics_file.read_text().splitlines()]
        first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
        assert last < first - 0.3, (metrics_file, losses)


def test_failing_combination_does_not_stop_the_sweep(tmp_path):
    # device=auto: fp8 is the node's to judge (it has no GPU here), so the sweep starts and that run fails.
    proc = run_cli(["-m", "experiment=smoke", "device=auto", "precision=fp8,fp32", "train.max_steps=5"], tmp_path)
    assert proc.returncode != 0
    assert "1 of 2 runs failed" in proc.stderr
    records = MlflowRecords(sqlite_uri(tmp_path))
    children = {c.data.params["precision"]: c for c in records.runs("run")}
    assert children["fp32"].info.status == "FINISHED"
    failed = children["fp8"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["ghsweep.error"].startswith("precision=fp8: needs an NVIDIA GPU")
    table_row = next(line for line in proc.stdout.splitlines() if " FAILED " in line)
    # Cut to the terminal's width (how much of the error fits depends on the other columns: "busy machine").
    assert "precision=fp8" in table_row and len(table_row) <= 120
    assert "#0 fp8 FAILED: deterministic: precision=fp8: needs an NVIDIA GPU" in proc.stdout  # whole in the verdict
    assert records.runs("sweep")[0].info.status == "FAILED"


def test_worker_crash_is_recorded_with_its_log(tmp_path):
    # A model folder that passes the checks before training (its config.json is whole) but whose weights
    # are not a safetensors file makes the worker itself fail after it started.
    model = unreadable_model(tmp_path / "model")
    proc = run_cli(["-m", "experiment=smoke", f"model.path={model}", "train.max_steps=2"], tmp_path)
    assert proc.returncode != 0
    records = MlflowRecords(sqlite_uri(tmp_path))
    client = records.client
    (child,) = records.runs("run")
    assert child.info.status == "FAILED"
    assert child.data.tags["ghsweep.error"] == UNREADABLE_WEIGHTS_ERROR
    assert "worker.log" in {a.path for a in client.list_artifacts(child.info.run_id)}


def test_single_run_is_parentless_with_same_content(tmp_path):
    proc = run_cli(["experiment=smoke", "train.max_steps=4", "peft=none"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = MlflowRecords(sqlite_uri(tmp_path))
    (run,) = records.runs("run")
    assert "mlflow.parentRunId" not in run.data.tags
    assert run.info.status == "FINISHED"
    assert RUN_METRICS <= set(run.data.metrics) and run.data.params["peft"] == "none"
    # Full fine-tuning in bf16 (the default precision): AdamW rounds the bf16 weights stochastically.
    assert run.data.tags["ghsweep.optimizer"] == "adamw_sr"
    assert "| optimizer | adamw_sr |" in (Path(run.data.tags["ghsweep.run_dir"]) / "report.md").read_text()
    assert not records.runs("sweep")


def test_single_run_bad_input_fails_before_training(tmp_path):
    proc = run_cli(["experiment=smoke", "peft.r=0"], tmp_path)
    assert proc.returncode != 0
    assert "peft.r=0: must be an integer >= 1" in proc.stderr
    assert not list(tmp_path.glob("outputs/*/*/worker.log"))


def test_help_lists_groups(tmp_path):
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0
    for line in ("peft: lora, none", "precision: bf16, fp16, fp32, fp8", "offload: off, on"):
        assert line in proc.stdout
    experiments = next(line for line in proc.stdout.splitlines() if line.startswith("experiment: "))
    assert "smoke" in experiments.split(": ")[1].split(", ")


def test_cfg_job_and_info_behave_as_in_hydra(tmp_path):
    cfg = run_cli(["--cfg", "job", "experiment=smoke", "precision=fp32"], tmp_path)
    assert cfg.returncode == 0 and "name: fp32" in cfg.stdout and "max_steps: 20" in cfg.stdout
    info = run_cli(["--info", "defaults"], tmp_path)
    assert info.returncode == 0 and "precision/bf16" in info.stdout and "peft/lora" in info.stdout
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs").exists()


TEARDOWN_PROBE = """
import atexit, logging, sys
from ghsweep.__main__ import end_without_teardown
atexit.register(end_without_teardown, [True] if sys.argv[1] == "succeeded" else [])
class Teardown:
    def __del__(self):
        print("torn down")
kept = Teardown()
log = logging.getLogger("probe")
log.addHandler(logging.FileHandler(sys.argv[2]))
log.warning("the last record")
print("the last line")  # block-buffered into the pipe: kept only if flushed
"""


def test_a_command_that_succeeded_ends_without_pythons_teardown_and_loses_no_output(tmp_path):
    """ghsweep.__main__.end_without_teardown, the last exit handler: after a command that succeeded the
    process ends with its output and log flushed, without tearing down its modules; otherwise as usual."""
    ends = {}
    for outcome in ("succeeded", "failed"):
        log_file = tmp_path / f"{outcome}.log"
        proc = subprocess.run(
            [sys.executable, "-c", TEARDOWN_PROBE, outcome, str(log_file)], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "the last line" in proc.stdout and log_file.read_text() == "the last record\n"
        ends[outcome] = "torn down" in proc.stdout
    assert ends == {"succeeded": False, "failed": True}
