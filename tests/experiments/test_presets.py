"""Every preset in experiments/ runs as the one command the README gives, at smoke size on CPU.

As lightning-hydra-template's `experiment=glob(*)` test: each preset's own sweep (its
hydra.sweeper.params) runs through the real CLI with SMOKE appended (a tiny Llama on CPU, a few
steps). What the preset studies needs a GPU in two cases, memory=unified and precision=fp8: a sweep
holding a combination no node can run is refused before anything is recorded, with the clear
validation error, so unified_memory is refused whole on CPU and precision_ladder is run without fp8.
top5_roofline's Nsight passes need a GPU too; its smoke run swaps them for the PyTorch profiler
(profile=torch, as documented in the README), so the assignment report still gets real Top-5 tables.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from ghsweep.core.names import split_overrides
from ghsweep.report.__main__ import main as report_main
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords
from tests.support.paths import REPO

SMOKE = [
    "model=tiny_llama",
    "device=cpu",
    "train.max_steps=3",
    "train.seq_length=64",
    "train.micro_batch_size=1",
    "train.warmup_steps=1",
    "train.log_every=1",
    "offload.num_layers=2",
    "capture.start_step=1",
    "capture.num_steps=1",
    "profile=none",
]
UNIFIED_ON_CPU = "memory=unified: CUDA managed memory needs an NVIDIA GPU and this run has none"
# Per preset: extra smoke overrides, and the outcome of each combination (by its swept override):
# "FINISHED", or the start of the error it must fail with.
EXPECTED = {
    "smoke": ([], {"": "FINISHED"}),
    "dataloader_workers": ([], {"dataloader.num_workers=0": "FINISHED", "dataloader.num_workers=4": "FINISHED"}),
    "offload_tradeoff": ([], {"offload=off": "FINISHED", "offload=on": "FINISHED"}),
    # Every combination needs a GPU: refused whole (the reason of each line of the refusal).
    "unified_memory": ([], {"peft=lora": UNIFIED_ON_CPU, "peft=none": UNIFIED_ON_CPU}),
    "precision_ladder": (["precision=fp32,bf16"], {"precision=fp32": "FINISHED", "precision=bf16": "FINISHED"}),
    "peft_vs_full": ([], {"peft=lora": "FINISHED", "peft=none": "FINISHED"}),
    "top5_roofline": (["profile=torch"], {"precision=fp32": "FINISHED", "precision=bf16": "FINISHED"}),
    # A tuning study: its trials are sampled; with precision fixed its random start covers offload's two values.
    "autotune": (
        ["precision=bf16", "tune.trials=3", "tune.startup_trials=3"],
        {"precision=bf16 offload=off": "FINISHED", "precision=bf16 offload=on": "FINISHED"},
    ),
}
PRESETS = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))


def test_every_preset_has_an_expected_outcome():
    assert PRESETS == sorted(EXPECTED), "add each new preset to EXPECTED with its smoke outcome"


def swept(overrides: str) -> str:
    """The combination's override that the preset sweeps (empty for a preset without a sweep)."""
    keys = {o.partition("=")[0] for o in SMOKE} | {"tracking.uri", "tracking.experiment"}
    own = [o for o in split_overrides(overrides) if not o.startswith("experiment=") and o.partition("=")[0] not in keys]
    return " ".join(own)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for all presets (each in its own experiment): creating a store costs seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('presets') / 'mlflow.db'}"


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_at_smoke_size(preset, store_uri, tmp_path, capsys):
    extra, outcomes = EXPECTED[preset]
    proc = run_cli(
        [
            "-m",
            f"experiment={preset}",
            *SMOKE,
            *extra,
            f"tracking.uri={store_uri}",
            f"tracking.experiment=preset_{preset}",
        ],
        tmp_path,
    )
    refusals = [o for o in outcomes.values() if o != "FINISHED"]
    if refusals:
        assert proc.returncode == 1, proc.stderr[-3000:]
        lines = proc.stderr.strip().splitlines()
        assert lines[-1] == (
            f"ghsweep: {len(refusals)} of {len(outcomes)} combinations cannot run on any node; "
            "nothing was submitted or recorded"
        )
        assert len(lines) == len(refusals) + 1
        assert all(reason in line for reason, line in zip(refusals, lines))
        return
    assert proc.returncode == 0, proc.stderr[-3000:]

    records = MlflowRecords(store_uri, f"preset_{preset}")
    client = records.client
    (parent,) = records.runs("sweep")
    children = records.runs("run")
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    got = {swept(c.data.tags["ghsweep.overrides"]): c for c in children}
    assert set(got) == set(outcomes)
    for combination, outcome in outcomes.items():
        run = got[combination]
        if outcome == "FINISHED":
            assert run.info.status == "FINISHED", run.data.tags.get("ghsweep.error")
            assert run.data.metrics["tokens_per_s"] > 0
        else:
            assert run.info.status == "FAILED"
            assert run.data.tags["ghsweep.error"].startswith(outcome), run.data.tags["ghsweep.error"]

    # The sweep's comparison was written, logged to the parent and summarised in the terminal.
    assert "ghsweep comparison:" in proc.stdout
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "comparison")}
    assert {"comparison/comparison.md", "comparison/comparison.html"} <= logged
    if preset == "top5_roofline":
        # Profiled runs (the PyTorch profiler here) also get the kernel-time shares plot.
        assert "comparison/plots/kernel_shares.png" in {
            a.path for a in client.list_artifacts(parent.info.run_id, "comparison/plots")
        }
        check_assignment(parent.info.run_name, store_uri, tmp_path, capsys)


def check_assignment(sweep_name: str, store_uri: str, cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's assignment report, from ghsweep.report's main in this process (the command itself:
    tests/report/test_assignment.py)."""
    capsys.readouterr()
    with contextlib.chdir(cwd):
        status = report_main(["--assignment", sweep_name, "--out", "asg", "--tracking-uri", store_uri])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    assert out.startswith("speedup of one iteration: ")
    md = (cwd / "asg" / "assignment.md").read_text()
    assert "| precision | fp32 | bf16 |" in md
    for label in ("baseline", "optimised"):
        part = md.split(f"## Top-5 kernels: {label}")[1].split("## ")[0]
        # On CPU the PyTorch profiler's Top-5 are CPU operators (aten::...); there is no ncu roofline.
        rows = [line for line in part.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert len(rows) == 5 and any("| aten::mm |" in r for r in rows), part
        assert "No roofline points" in part
