"""The comparison at the end of a real sweep, and `python -m ghsweep.report` rebuilding it from MLflow alone."""

from __future__ import annotations

import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.conftest import run_cli


def test_sweep_end_writes_logs_and_prints_the_comparison(smoke_sweep):
    cwd, proc = smoke_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    block = proc.stdout.split("ghsweep comparison:\n")[1].split("\n\n")[0].splitlines()
    for column in (
        "precision",
        "offload",
        "status",
        "step ms",
        "tokens/s",
        "speedup",
        "TFLOP/s",
        "MFU",
        "peak GiB",
        "GPU idle %",
        "Pareto",
        "top finding / error",
    ):
        assert column in block[0]
    assert [line.split()[0] for line in block[2:6]] == ["0", "1", "2", "3"]
    assert all(" FINISHED " in line for line in block[2:6]) and " baseline " in block[2]
    verdict = [line.strip() for line in block[6:]]
    assert verdict[0] == "4 of 4 combinations finished."
    assert verdict[1].startswith("Baseline: #0 fp32 off (")
    (sweep_dir,) = [p.parent for p in cwd.glob("multirun/*/*/comparison")]
    md = (sweep_dir / "comparison" / "comparison.md").read_text()
    assert md.count("| FINISHED |") == 4
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ghsweep")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`ghsweep.role` = 'sweep'")
    assert parent.data.tags["ghsweep.baseline"] == "#0 fp32 off"
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "comparison/plots")}
    assert {
        "comparison/plots/speedup.png",
        "comparison/plots/loss_curves.png",
        "comparison/plots/throughput_vs_memory.png",
    } <= logged


def test_report_command_rebuilds_the_same_report_from_mlflow_alone(smoke_sweep, tmp_path):
    cwd, _ = smoke_sweep
    (sweep_dir,) = [p.parent for p in cwd.glob("multirun/*/*/comparison")]
    name = "/".join(sweep_dir.parts[-2:])  # the sweep's name without its "sweep " prefix
    # Elsewhere, with the run directories out of reach: only the tracking store is read.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.report",
            name,
            "--out",
            "again",
            "--tracking-uri",
            f"sqlite:///{cwd / 'mlflow.db'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("4 of 4 combinations finished.\nBaseline: #0 fp32 off (")
    rebuilt = (tmp_path / "again" / "comparison.md").read_text()
    assert rebuilt == (sweep_dir / "comparison" / "comparison.md").read_text()
    with_other_baseline = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghsweep.report",
            name,
            "--out",
            "b3",
            "--baseline",
            "3",
            "--tracking-uri",
            f"sqlite:///{cwd / 'mlflow.db'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert with_other_baseline.returncode == 0
    assert "Baseline: #3 bf16 on (" in with_other_baseline.stdout


def test_bad_baseline_is_one_line_and_the_sweep_still_finishes(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "peft=lora", "train.max_steps=2", "report.baseline=7"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ghsweep: no comparison report: "))
    assert line.endswith(
        "report.baseline=7: matches no combination of this sweep; accepted: a job number (0) or "
        "the overrides of one combination, e.g. 'experiment=smoke peft=lora train.max_steps=2'"
    )
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ghsweep")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`ghsweep.role` = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["ghsweep.report_error"].startswith("report.baseline=7: matches no combination")
