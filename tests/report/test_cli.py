"""The comparison at the end of a real sweep, and `python -m ghsweep.report` rebuilding it from MLflow alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ghsweep.core.names import CONTENDED_TAG, ROLE_SWEEP
from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun
from tests.support.cli import run_cli


def sweep_run(db: Path) -> tuple[MlflowStore, StoredRun]:
    """The store at `db` (read across its experiments) and the one sweep it holds."""
    store = MlflowStore(f"sqlite:///{db}", None)
    (parent,) = store.search(role=ROLE_SWEEP)
    return store, parent


def rebuild(cwd: Path, name: str, db: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m ghsweep.report NAME ARGS` in `cwd`, against the store at `db`."""
    return subprocess.run(
        [sys.executable, "-m", "ghsweep.report", name, *args, "--tracking-uri", f"sqlite:///{db}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


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
        "peak GiB",
        "Pareto",
    ):
        assert column in block[0]
    # Within 120 columns: the findings column does not fit beside two knobs; the verdict below says them.
    assert max(len(line) for line in block) <= 120 and "top finding" not in block[0]
    # A CPU sweep has no MFU, energy or GPU idle time: the terminal leaves their empty columns out.
    assert not {"MFU", "tokens/J", "GPU idle %"} & set(block[0].split("  "))
    assert [line.split()[0] for line in block[2:6]] == ["0", "1", "2", "3"]
    assert all(" FINISHED " in line for line in block[2:6]) and " baseline " in block[2]
    verdict = [line.strip() for line in block[6:]]
    assert verdict[0] == "4 of 4 combinations finished."
    assert verdict[1].startswith("Baseline: #0 fp32 off (")
    (sweep_dir,) = [p.parent for p in cwd.glob("multirun/*/*/comparison")]
    md = (sweep_dir / "comparison" / "comparison.md").read_text()
    assert md.count("| FINISHED |") == 4
    store, parent = sweep_run(cwd / "mlflow.db")
    assert parent.tags["ghsweep.baseline"] == "#0 fp32 off"
    logged = store.artifact_paths(parent.run_id, "comparison/plots")
    assert {"comparison/plots/loss_curves.png", "comparison/plots/throughput_vs_memory.png"} <= logged
    # The speedup plot needs speedups: none is compared with a baseline measured on a busy machine (a
    # loaded CI machine, say), and then none is drawn.
    children = store.search(parent_run_id=parent.run_id)
    (baseline,) = [c for c in children if (c.params.get("precision"), c.params.get("offload")) == ("fp32", "off")]
    assert ("comparison/plots/speedup.png" in logged) == (CONTENDED_TAG not in baseline.tags)


def test_report_command_rebuilds_the_same_report_from_mlflow_alone(smoke_sweep, tmp_path):
    cwd, _ = smoke_sweep
    (sweep_dir,) = [p.parent for p in cwd.glob("multirun/*/*/comparison")]
    name = "/".join(sweep_dir.parts[-2:])  # the sweep's name without its "sweep " prefix
    # Elsewhere, with the run directories out of reach: only the tracking store is read.
    proc = rebuild(tmp_path, name, cwd / "mlflow.db", "--out", "again")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("4 of 4 combinations finished.\nBaseline: #0 fp32 off (")
    rebuilt = (tmp_path / "again" / "comparison.md").read_text()
    assert rebuilt == (sweep_dir / "comparison" / "comparison.md").read_text()
    with_other_baseline = rebuild(tmp_path, name, cwd / "mlflow.db", "--out", "b3", "--baseline", "3")
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
    _, parent = sweep_run(tmp_path / "mlflow.db")
    assert parent.status == "FINISHED"
    assert parent.tags["ghsweep.report_error"].startswith("report.baseline=7: matches no combination")
