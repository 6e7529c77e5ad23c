"""nsys GPU metrics (profile.nsys.gpu_metrics): the flag on the nsys command line, and the analysis
of the samples over the steady window, on a real export (tests/data/profiles/bf16) with GPU_METRICS
and TARGET_INFO_GPU_METRICS planted in nsys's schema."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from ghsweep.capture import nsight_commands
from ghsweep.profile.analysis import analyze
from ghsweep.profile.findings import evaluate

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"
# Hopper's metric names as nsys writes them (metricId, name).
METRICS = {
    1: "SMs Active [Throughput %]",
    2: "Tensor Active [Throughput %]",
    3: "DRAM Read Bandwidth [Throughput %]",
    4: "DRAM Write Bandwidth [Throughput %]",
    5: "PCIe RX Throughput [Throughput %]",
    6: "PCIe TX Throughput [Throughput %]",
}
INSIDE = {1: 80, 2: 61, 3: 30, 4: 5, 5: 2, 6: 7}


def planted(tmp_path: Path) -> Path:
    export = tmp_path / "profile.sqlite"
    shutil.copy(PROFILES / "bf16" / "profile.sqlite", export)
    window = analyze(export).window
    start, end = window["start_ns"], window["end_ns"]
    with sqlite3.connect(export) as con:
        con.execute(
            "CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, "
            "typeName TEXT NOT NULL, metricId INTEGER NOT NULL, metricName TEXT NOT NULL)"
        )
        con.execute(
            "CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL, "
            "value INTEGER NOT NULL)"
        )
        con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (65536, 0, 'GH100', ?, ?)", list(METRICS.items()))
        samples = [(t, 65536, m, v) for t in range(start, end, (end - start) // 20) for m, v in INSIDE.items()]
        # Before the steady window (warm-up, module loading): idle, and left out of the means.
        samples += [(start - 10**6 * k, 65536, m, 0) for k in range(1, 40) for m in METRICS]
        con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)", samples)
    return export


def test_the_flag_is_on_the_nsys_command_only_when_asked():
    args = ("nsys", Path("r.nsys-rep"), ["cuda"], False, [])
    assert (
        "--gpu-metrics-devices=cuda-visible" in nsight_commands.NsysCapture(*args, gpu_metrics=True).profile_command()
    )
    assert not [a for a in nsight_commands.NsysCapture(*args).profile_command() if a.startswith("--gpu-metrics")]


def test_the_analysis_reads_the_metrics_over_the_steady_window(tmp_path):
    analysis = analyze(planted(tmp_path))
    assert analysis.gpu_metrics == {METRICS[m]: float(v) for m, v in INSIDE.items()}
    (said,) = [f for f in evaluate(analysis) if f.id == "gpu_metrics"]
    assert said.message.endswith(
        "SMs active 80%, tensor cores active 61%, DRAM bandwidth 35%, PCIe bandwidth 7% (of each one's peak)"
    )


def test_the_metrics_of_a_real_h100_capture_are_read_by_their_own_names(tmp_path):
    # nsys's 22 Hopper metrics in its own tables (the schema and metric list of a real capture,
    # gpu_metrics_h100/README.md), sampled at the means that capture measured over its steady window.
    # "Unallocated Warps in Active SMs [Avg]" (millions) shares words with "SMs Active [Throughput %]".
    real = PROFILES / "gpu_metrics_h100"
    means = json.loads((real / "steady_means.json").read_text())
    export = tmp_path / "profile.sqlite"
    shutil.copy(PROFILES / "bf16" / "profile.sqlite", export)
    window = analyze(export).window
    start, end = window["start_ns"], window["end_ns"]
    with sqlite3.connect(export) as con:
        con.execute(f"ATTACH DATABASE '{real / 'gpu_metrics_sample.sqlite'}' AS real")
        for table in ("TARGET_INFO_GPU_METRICS", "GPU_METRICS"):
            con.execute(con.execute(f"SELECT sql FROM real.sqlite_master WHERE name = '{table}'").fetchone()[0])
        con.execute("INSERT INTO TARGET_INFO_GPU_METRICS SELECT * FROM real.TARGET_INFO_GPU_METRICS")
        metrics = con.execute("SELECT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS").fetchall()
        con.executemany(
            "INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)",
            [
                (t, t, kind, m, round(means[name]))
                for t in range(start, end, (end - start) // 20)
                for kind, m, name in metrics
            ],
        )
    analysis = analyze(export)
    assert len(analysis.gpu_metrics) == 22
    (said,) = [f for f in evaluate(analysis) if f.id == "gpu_metrics"]
    assert said.message.endswith(
        "SMs active 89%, tensor cores active 60%, DRAM bandwidth 41%, PCIe bandwidth 1% (of each one's peak)"
    )


def test_an_export_without_gpu_metrics_says_nothing_of_them():
    analysis = analyze(PROFILES / "bf16" / "profile.sqlite")
    assert analysis.gpu_metrics == {}
    assert not [f for f in evaluate(analysis) if f.id == "gpu_metrics"]
