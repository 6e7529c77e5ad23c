"""benchmarks/diagnosis.py, the table benchmarks/diagnosis.sh prints, on planted sweeps: a bf16/fp8
pair repeated twice and a 1 vs 2 GPU pair, each run directory as a sweep leaves it (result.json,
summary.json with the measured step, the profile and its analysis)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ghsweep.core.run_result import RunResult
from ghsweep.core.run_summary import RunSummary
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.run_analysis import full_analysis, rank_analysis
from tests.profile.planted import ONE, RANKS, planted_rank, training_run, write_nsys

ROOT = Path(__file__).resolve().parents[2]
FP8_GEMM = "nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT"


def planted_run(run_dir: Path, overrides: list[str], runs: list, measured_ms: float) -> None:
    run_dir.mkdir(parents=True)
    RunResult(run_dir.name, str(run_dir), overrides, "FINISHED", metrics={"peak_mem_gb": 54.0}).save()
    RunSummary(metrics={"step_time_ms": measured_ms}).save(run_dir)
    if len(runs) == 1:
        analysis = full_analysis(write_nsys(runs[0], run_dir / "profile.sqlite"), measured=MeasuredRun(measured_ms))
    else:
        paths = [write_nsys(r, run_dir / f"profile_rank{i}.sqlite") for i, r in enumerate(runs)]
        analysis = rank_analysis(paths, None, len(runs), measured=MeasuredRun(measured_ms))
    analysis.save(run_dir)


def test_the_diagnosis_table(tmp_path):
    repeats, scaling = tmp_path / "repeats", tmp_path / "scaling"
    job = 0
    for repeat in (1, 2):
        for precision, kwargs in (("bf16", {}), ("fp8", {"gemm": FP8_GEMM, "gemm_us": 120})):
            run = training_run(lambda i: f"step {i}", **kwargs)
            planted_run(repeats / str(job), [f"repeat={repeat}", f"precision={precision}"], [run], 8.0)
            job += 1
    planted_run(scaling / "0", ["backend.gpus_per_node=1"], [planted_rank(**ONE)], 4.0)
    planted_run(scaling / "1", ["backend.gpus_per_node=2"], [planted_rank(**r) for r in RANKS], 5.0)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "diagnosis.py"),
            str(repeats),
            str(scaling),
            "--out",
            str(out / "diagnosis.json"),
            "--exports",
            str(out / "exports"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "diagnosis.json").read_text())
    assert len(record["runs"]) == 6 and all(r["profiler_overhead_pct"] is not None for r in record["runs"])
    assert [r["same_ids"] for r in record["repeats"]] == [True, True]
    pairs = {k: v for k, v in record["pairs"].items() if "cli" in v}
    assert len(pairs) == 3  # fp8 vs bf16 in each repeat, 2 GPUs vs 1
    for pair in pairs.values():
        d = pair["cli"]
        assert abs(sum(d["parts"].values()) - d["difference_ms"]) < 1e-9
        assert d == json.loads(json.dumps(pair["from_saved_analyses"]))  # the CLI reads what the sweep saved
    assert any(k.startswith("scale-out") for k in record["pairs"])
    assert "== analyze --against" in done.stdout and "bf16 GEMMs -" in done.stdout
    assert sorted(p.name for p in (out / "exports").rglob("*.gz"))[:2] == ["profile_rank0.sqlite.gz"] * 2
