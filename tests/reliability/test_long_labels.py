"""A long value (`+notes.a=<10,000 characters>`) reaches tables, plot labels and reports bounded: a
label that long grew the speedup plot to 10 MB and drawing it again (`ghsweep.report`) to 19 GB."""

from __future__ import annotations

import subprocess
import sys

from ghsweep.report.sweep_table import LABEL_CHARS, bounded, knob_values
from tests.support.cli import run_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.sweep_dirs import only_sweep_dir

LONG = "n" * 10_000
MAX_PLOT_BYTES = 300_000


def test_a_long_value_is_bounded_and_says_how_long_it_was():
    assert bounded("bf16") == "bf16"
    shown = knob_values([f"+notes.a={LONG}", "precision=bf16"])
    assert shown == {"+notes.a": "n" * (LABEL_CHARS - 16) + "… (10,000 chars)", "precision": "bf16"}
    assert len(shown["+notes.a"]) <= LABEL_CHARS


def test_a_long_value_leaves_tables_and_plots_small(tmp_path):
    proc = run_cli(
        ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2", "train.seq_length=64", f"+notes.a={LONG}"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = only_sweep_dir(tmp_path)
    table = [line for line in proc.stdout.splitlines() if line.startswith("0 ")]
    assert table and all(LONG not in line and "… (10,000 chars)" in line for line in table)
    plots = list((sweep / "comparison" / "plots").glob("*.png"))
    assert plots and all(p.stat().st_size < MAX_PLOT_BYTES for p in plots), [(p.name, p.stat().st_size) for p in plots]
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    rebuilt = subprocess.run(
        [sys.executable, "-m", "ghsweep.report", parent.run_id, "--out", "again"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    again = list((tmp_path / "again" / "plots").glob("*.png"))
    assert again and all(p.stat().st_size < MAX_PLOT_BYTES for p in again)
