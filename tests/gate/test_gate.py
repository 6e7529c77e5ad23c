"""The regression gate on a real CPU sweep recorded in MLflow: the reference written, a pass and a missing
reference through its real CLI, every other verdict from its main in this process (tests/support/gate.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ghsweep.gate import regressions
from ghsweep.report.sweep_source import SweepRun
from tests.support.cli import run_cli
from tests.support.gate import gate, gate_cli
from tests.support.models import unreadable_model

SWEEP = ["-m", "experiment=smoke", "precision=fp32,bf16", "train.max_steps=6", "train.seq_length=64"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("gate")
    proc = run_cli([*SWEEP, "hydra.sweep.dir=sweep"], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = gate_cli(cwd, "sweep", "--against", "ref.json", "--write", "--checks", "tokens_per_s,peak_mem_gb,loss")
    assert written.returncode == 0, written.stderr
    return cwd


def regression_lines(proc: subprocess.CompletedProcess, text: str) -> int:
    return sum(line.startswith("REGRESSION ") and text in line for line in proc.stdout.splitlines())


def planted(cwd: Path, name: str, change, source: str = "ref.json") -> str:
    """A copy of a reference with `change(reference)` applied."""
    reference = json.loads((cwd / source).read_text())
    # Without the intervals, values alone are compared (a reference recorded before ghsweep kept them),
    # so the planted changes are judged the same whatever the noise of this machine.
    reference.pop("noise_pct", None)
    change(reference)
    (cwd / name).write_text(json.dumps(reference))
    return name


def scale(metric: str, factor: float):
    def change(reference: dict) -> None:
        for values in reference["runs"].values():
            values[metric] *= factor

    return change


def test_written_reference_holds_every_run_and_the_sweep_passes_it(swept):
    reference = json.loads((swept / "ref.json").read_text())
    assert set(reference["runs"]) == {
        f"experiment=smoke precision={p} train.max_steps=6 train.seq_length=64" for p in ("fp32", "bf16")
    }
    for values in reference["runs"].values():
        assert [step for step, _ in values["loss"]] == list(range(6))
        assert values["tokens_per_s"] > 0 and values["peak_mem_gb"] > 0
    proc = gate_cli(swept, "sweep", "--against", "ref.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ghsweep.gate: passed: 0 regressions, 0 inconclusive in 2 combinations" in proc.stdout
    # Which reference it read, and the code on both sides.
    code = reference["code"]
    assert code.startswith("ghsweep ") and ", " not in code
    assert f"ghsweep.gate: reference {swept / 'ref.json'}: recorded with {code}; this sweep ran {code}" in proc.stdout
    reference = json.loads((swept / "ref.json").read_text())
    # Six steps leave too few steady ones for an interval: the reference says so by holding none.
    assert set(reference["noise_pct"]) == set(reference["runs"])
    assert all(set(noise) <= {"tokens_per_s"} for noise in reference["noise_pct"].values())


def older_code(reference: dict) -> None:
    reference["code"] = "ghsweep 0.0.9 commit 0123456789ab"


def test_a_planted_ten_percent_regression_fails_with_one_line_per_run(swept):
    # The reference 10% faster than this sweep, recorded with other code: this code is a 10% regression.
    faster = planted(swept, "faster.json", lambda r: (scale("tokens_per_s", 1 / 0.9)(r), older_code(r)))
    proc = gate(swept, "sweep", "--against", faster, "--tolerance", "5%")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"reference {swept / faster}: recorded with ghsweep 0.0.9 commit 0123456789ab; this sweep ran ghsweep " in (
        proc.stdout
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REGRESSION ")]
    assert len(lines) == 2 and all("tokens_per_s" in line and "(-10.0%, tolerance 5%)" in line for line in lines)
    memory = gate(swept, "sweep", "--against", planted(swept, "smaller.json", scale("peak_mem_gb", 0.9)))
    assert memory.returncode == 1 and regression_lines(memory, "peak_mem_gb") == 2, memory.stdout


def test_noise_within_the_tolerance_passes(swept):
    noisy = planted(swept, "noisy.json", lambda r: (scale("tokens_per_s", 1.03)(r), scale("peak_mem_gb", 0.97)(r)))
    proc = gate(swept, "sweep", "--against", noisy, "--tolerance", "5%")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def with_noise(metric: str, factor: float, pct: float):
    """Scale `metric` of every run of the reference by `factor` and give it a ±`pct` interval."""

    def change(reference: dict) -> None:
        scale(metric, factor)(reference)
        reference["noise_pct"] = {name: {metric: pct} for name in reference["runs"]}

    return change


def test_noise_wider_than_the_tolerance_is_inconclusive(swept):
    # A 10% drop, but the reference measured ±40%: neither a pass nor a fail.
    proc = gate(swept, "sweep", "--against", planted(swept, "wide.json", with_noise("tokens_per_s", 1 / 0.9, 40.0)))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert sum(line.startswith("INCONCLUSIVE ") and "tokens_per_s" in line for line in proc.stdout.splitlines()) == 2
    assert "ghsweep.gate: inconclusive: 0 regressions, 2 inconclusive" in proc.stdout


def test_a_drop_beyond_tolerance_and_noise_fails(swept):
    # 50% slower than a reference measured to ±0.5%: beyond any noise of this sweep too.
    proc = gate(swept, "sweep", "--against", planted(swept, "tight.json", with_noise("tokens_per_s", 2.0, 0.5)))
    assert proc.returncode == 1 and regression_lines(proc, "noise ±") == 2, proc.stdout + proc.stderr


def test_a_missing_or_failed_run_fails(swept):
    def add_run(reference: dict) -> None:
        reference["runs"]["experiment=smoke precision=fp16 train.max_steps=6 train.seq_length=64"] = {
            "loss": [[0, 5.0]]
        }

    proc = gate(swept, "sweep", "--against", planted(swept, "more.json", add_run))
    assert proc.returncode == 1
    assert (
        "REGRESSION experiment=smoke precision=fp16 train.max_steps=6 train.seq_length=64: not in the sweep"
        in proc.stdout
    )

    # A combination that starts and then fails in its worker: weights that are not a safetensors file.
    model = unreadable_model(swept / "model")
    failing = run_cli(
        [*SWEEP[:2], "precision=fp32", *SWEEP[3:], f"model.path={model}", "hydra.sweep.dir=broken"], swept
    )
    assert failing.returncode != 0

    def expect_broken(reference: dict) -> None:
        key = f"experiment=smoke model.path={model} precision=fp32 train.max_steps=6 train.seq_length=64"
        reference["runs"] = {key: {"loss": [[0, 5.0]]}}

    proc = gate(swept, "broken", "--against", planted(swept, "broken.json", expect_broken))
    assert proc.returncode == 1 and "FAILED: SafetensorError: Error while deserializing header" in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_a_loss_curve_outside_the_band_fails(swept):
    def shift(reference: dict) -> None:
        for values in reference["runs"].values():
            values["loss"][-1][1] *= 1.1

    proc = gate(swept, "sweep", "--against", planted(swept, "loss.json", shift), "--loss-band", "5%")
    assert proc.returncode == 1 and regression_lines(proc, "loss at step 5") == 2, proc.stdout


def test_overhead_is_not_judged_for_a_forked_worker(swept):
    """The README's first command forks its workers (worker.preimported, the default): a reference that
    gates overhead_ratio, as CI's does, gates its loss curves and says the overhead was left out."""
    written = gate(swept, "sweep", "--against", "overhead.json", "--write", "--checks", "loss,overhead_ratio")
    assert written.returncode == 0, written.stderr
    runs = json.loads((swept / "overhead.json").read_text())["runs"]
    assert all("overhead_ratio" not in values and values["loss"] for values in runs.values())

    def fresh_workers_ratio(reference: dict) -> None:
        for values in reference["runs"].values():
            values["overhead_ratio"] = 1.5

    proc = gate(swept, "sweep", "--against", planted(swept, "ci.json", fresh_workers_ratio, "overhead.json"))
    assert proc.returncode == 0, proc.stdout
    notes = [line for line in proc.stdout.splitlines() if "overhead_ratio not judged" in line]
    assert len(notes) == 2 and notes[0].startswith("note: "), proc.stdout


def sweep_run(preimported: bool, overhead_s: float, startup_s: float) -> SweepRun:
    params = {"worker.preimported": str(preimported)}
    metrics = {"overhead_s": overhead_s, "startup_s": startup_s}
    return SweepRun("r" * 32, "x", 0, "FINISHED", ["experiment=smoke"], params, metrics, {})


def test_overhead_as_a_ratio_to_the_runs_own_start():
    reference = {"checks": ["overhead_ratio"], "tolerances": {"overhead_ratio": 0.2}}
    reference["runs"] = {"experiment=smoke": {"overhead_ratio": 1.0}}
    assert regressions(reference, [sweep_run(False, 6.0, 5.0)], 0.05, 0.05) == ([], [], [])
    found, _, _ = regressions(reference, [sweep_run(False, 8.0, 5.0)], 0.05, 0.05)
    assert len(found) == 1 and "overhead_ratio 1.6 against 1 (+60.0%, tolerance 20%)" in found[0], found
    found, _, left_out = regressions(reference, [sweep_run(True, 8.0, 0.1)], 0.05, 0.05)
    assert found == [] and len(left_out) == 1


def test_a_sweep_by_its_mlflow_name(swept):
    name = "sweep " + json.loads((swept / "sweep" / "ghsweep_sweep.json").read_text())["parent_run_id"]
    proc = gate(swept, name.split(" ")[1], "--against", "ref.json", "--tracking-uri", "sqlite:///mlflow.db")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tolerance", "five"], "'five': a fraction such as 5% or 0.05"),
        (["--write", "--checks", "speed"], "--checks speed: unknown; accepted: tokens_per_s"),
    ],
)
def test_bad_arguments_are_one_line_errors(swept, args, message):
    proc = gate(swept, "sweep", "--against", "x.json", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_missing_reference_says_how_to_make_one(swept):
    proc = gate_cli(swept, "sweep", "--against", "none.json")
    assert proc.returncode == 2 and "--against none.json: no such file; record one with --write" in proc.stderr
