"""The small things a first hour meets: `python -m ghsweep.status` with no sweep named, the report
run where there is no store, the CPU profile report, a knob the run could not apply, worker.log
without library noise, and --help naming the launchers and sweepers."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

from ghsweep import status
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.launch.callbacks import record_end
from ghsweep.launch.sweep_manifest import SweepEnd, SweepManifest
from ghsweep.profile.profile_report import render
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.report import __main__ as report_cli
from ghsweep.report.sweep_source import SweepRun
from ghsweep.train.worker import quiet_library_noise
from tests.support.cli import run_cli


def test_status_without_a_sweep_lists_the_newest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert status.main([]) == 2
    assert "no sweep under" in capsys.readouterr().out
    for name in ("10-00-00", "11-00-00"):
        sweep_dir = tmp_path / "multirun" / "2026-11-21" / name
        sweep_dir.mkdir(parents=True)
        SweepManifest("sqlite:///mlflow.db", "ghsweep", "0" * 32, f"python -m ghsweep -m seed={name}").save(sweep_dir)
    assert status.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ghsweep.status: the newest sweeps under multirun;")
    assert lines[1:] == [
        "  multirun/2026-11-21/11-00-00  (local: python -m ghsweep -m seed=11-00-00)",
        "  multirun/2026-11-21/10-00-00  (local: python -m ghsweep -m seed=10-00-00)",
    ]


def ended_sweep(sweep_dir, statuses, interrupt=None):
    """A sweep directory as a local sweep's end leaves it: its manifest and its end, no process holding it."""
    sweep_dir.mkdir(parents=True)
    SweepManifest("sqlite:///mlflow.db", "ghsweep", "p" * 32, "python -m ghsweep -m seed=1,2").save(sweep_dir)
    results = [RunResult(f"seed={n}", str(sweep_dir / str(n)), [], s) for n, s in enumerate(statuses)]
    record_end(sweep_dir, results, failures_expected=False, interrupt=interrupt)
    return sweep_dir


def test_status_of_an_ended_sweep_exits_non_zero_when_a_run_failed(tmp_path, capsys):
    failed = ended_sweep(tmp_path / "failed", [RunStatus.FINISHED, RunStatus.FAILED])
    assert status.main([str(failed)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"ghsweep: the sweep ended FAILED (MLflow run {'p' * 32})",
        "ghsweep: 1 of 2 runs failed: seed=1",
    ]
    assert status.main([str(ended_sweep(tmp_path / "fine", [RunStatus.FINISHED] * 2))]) == 0
    assert "the sweep ended FINISHED" in capsys.readouterr().out
    # A run cancelled from outside (scancel) ended KILLED while the sweep went on: the sweep failed.
    cancelled = ended_sweep(tmp_path / "cancelled", [RunStatus.FINISHED, RunStatus.KILLED])
    assert status.main([str(cancelled)]) == 1
    assert "1 of 2 runs failed: seed=1" in capsys.readouterr().out
    interrupted = ended_sweep(tmp_path / "stopped", [RunStatus.FINISHED, RunStatus.KILLED], KeyboardInterrupt())
    assert status.main([str(interrupted)]) == 0  # stopped, not failed: the same command resumes it
    assert "the sweep ended KILLED" in capsys.readouterr().out
    SweepEnd.clear(interrupted)  # resumed: its earlier end no longer answers
    assert SweepEnd.load(interrupted) is None


def test_status_of_a_running_sweep_is_told_by_its_lock(tmp_path, capsys):
    running = tmp_path / "running"
    SweepManifest.claim(running, "pid 42 on here, started at tick 7")  # held by this process from here on
    SweepManifest("sqlite:///mlflow.db", "ghsweep", "p" * 32, "python -m ghsweep -m seed=1,2").save(running)
    assert status.main([str(running)]) == 0
    assert capsys.readouterr().out == (
        "ghsweep: the sweep is still running (pid 42 on here, started at tick 7); run this again later\n"
    )


def test_status_of_an_ended_sweep_imports_no_heavy_library(tmp_path):
    """What made it take 12-16 s on a busy machine: MLflow, submitit, torch and Hydra, imported for a
    look at files."""
    failed = ended_sweep(tmp_path / "failed", [RunStatus.FAILED])
    code = (
        "import sys; from ghsweep import status; rc = status.main([sys.argv[1]]); "
        "print(rc, sorted(m for m in ('mlflow', 'submitit', 'torch', 'hydra', 'matplotlib') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(failed)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[-1] == "1 []", proc.stderr


def test_the_report_where_there_is_no_store_creates_none(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert report_cli.main(["sweep 2026-11-21/01-49-38"]) == 2
    assert capsys.readouterr().err.startswith(f"ghsweep.report: no MLflow store at {tmp_path / 'mlflow.db'};")
    assert not list(tmp_path.iterdir())


def test_a_cpu_profile_report_is_not_a_table_of_na():
    cpu = ProfileAnalysis(source={"kind": "torch"}, window={"basis": "cpu steps"}, phases_ms_per_step={"forward": 1.0})
    text = render(cpu)
    assert "n/a" not in text and "| metric | value |" not in text
    assert "No GPU activity in this profile, so the GPU-time metrics do not apply." in text
    gpu = ProfileAnalysis(source={"kind": "nsys"}, window={}, gpu_busy_pct=90.0, gpu_idle_pct=10.0)
    text = render(gpu)
    assert "| gpu_busy_pct | 90 |" in text and "n/a" not in text
    assert "Not in this profile: idle_gaps_per_step," in text


def run(overrides: list[str], offload_applied: str | None) -> SweepRun:
    tags = {} if offload_applied is None else {"ghsweep.offload_applied": offload_applied}
    return SweepRun("r" * 32, " ".join(overrides), 0, "FINISHED", overrides, {}, {}, tags)


def test_a_knob_the_run_could_not_apply_is_marked():
    on_cpu = run(["precision=bf16", "offload=on"], "False")
    assert on_cpu.shown_knobs == {"precision": "bf16", "offload": "on (no effect here)"}
    assert on_cpu.knobs["offload"] == "on"  # matching (report.baseline) still sees the value
    assert run(["offload=on"], "True").shown_knobs == {"offload": "on"}
    assert run(["offload=off"], None).shown_knobs == {"offload": "off"}
    assert run(["offload=off"], "False").shown_knobs == {"offload": "off"}  # nothing asked, nothing missed


def test_worker_log_leaves_out_library_noise_only(caplog):
    quiet_library_noise()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: Could not load this library")
        logging.getLogger("torchao").warning("a torchao warning that matters")
        logging.getLogger("torch.utils._pytree").warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile"
        )
    assert [r.getMessage() for r in caplog.records] == ["a torchao warning that matters"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_library_noise()
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
        )
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]


def test_help_lists_the_launchers_and_sweepers(tmp_path):
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("hydra/launcher: ") and "gh200" in line and "local_slurm" in line for line in lines)
    assert "hydra/sweeper: basic, tune" in lines
    assert "precision: bf16, fp16, fp32, fp8" in lines
