"""Bad input to `python -m ghsweep.analyze` ends in one line naming the file and what is wrong,
exit status 2: never a traceback, never exit 0 on an empty or unusable profile. The two readers
are fuzzed (truncated files, dropped tables and columns, events missing keys)."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ghsweep.analyze import main
from ghsweep.core.errors import ProfileError
from ghsweep.profile.analysis import analyze
from tests.profile.planted import training_run, write_torch

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles"
CLEAN = DATA / "clean" / "profile.sqlite"


def cli(path: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main([str(path), *extra])
    err = capsys.readouterr().err
    return code, err


def assert_refused(path: Path, capsys, what: str, *extra: str) -> None:
    code, err = cli(path, capsys, *extra)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and what in lines[0], lines


def sqlite_copy(tmp_path: Path, edit: str | None = None) -> Path:
    path = tmp_path / "profile.sqlite"
    shutil.copy(CLEAN, path)
    if edit:
        con = sqlite3.connect(path)
        con.executescript(edit)
        con.close()
    return path


@pytest.mark.parametrize(
    "name,content,what",
    [
        ("missing.sqlite", None, "no such file"),
        ("empty.sqlite", b"", "no tables"),
        ("text.sqlite", b"not sqlite at all " * 200, "not a readable nsys"),
        ("half.sqlite", CLEAN.read_bytes()[:200_000], "not a readable nsys"),
        ("t.json", b'{"traceEvents": [', "not a readable JSON trace"),
        ("t.json.gz", b"{}", "not a readable JSON trace"),
        ("t.json", b'{"traceEvents": []}', "an empty trace"),
        ("t.json", b'{"schemaVersion": 1}', "not a Chrome trace"),
        ("t.json", b'[{"ph": "X", "cat": "cpu_instant_event", "ts": 1, "dur": 2}]', "neither GPU activity nor CPU"),
        ("a.txt", b"x", "not a profile this tool reads"),
        ("", None, "no profile in this directory"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, capsys, name, content, what):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert_refused(path, capsys, what)


@pytest.mark.parametrize(
    "edit,what",
    [
        ("DROP TABLE StringIds", "no StringIds table"),
        (
            "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL; DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY; "
            "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET",
            "no GPU activity",
        ),
        (
            "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL; DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY; "
            "DELETE FROM CUPTI_ACTIVITY_KIND_MEMSET",
            "no GPU activity",
        ),
        ("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN correlationId", "lacks the columns correlationId"),
    ],
)
def test_unusable_exports_are_one_line_errors(tmp_path, capsys, edit, what):
    assert_refused(sqlite_copy(tmp_path, edit), capsys, what)


def test_torch_profiler_output_directory(tmp_path, capsys):
    run = training_run(lambda i: f"step {i}")
    older = write_torch(run, tmp_path / "host_1.1700000000.pt.trace.json")
    assert main([str(tmp_path), "--json"]) == 0  # the profiler's output directory is read
    assert json.loads(capsys.readouterr().out)["source"]["path"] == str(older)
    newer = write_torch(run, tmp_path / "host_1.1700000001.pt.trace.json.gz")
    os.utime(older, (1, 1))
    assert main([str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["source"]["path"] == str(newer)
    assert captured.err.strip() == (
        f"ghsweep.analyze: {tmp_path}: 2 PyTorch profiler traces; analysing the newest, "
        f"{newer.name} (pass another one to analyse it)"
    )


def test_missing_ncu_csv(tmp_path, capsys):
    code, err = cli(CLEAN, capsys, "--ncu", str(tmp_path / "nope.csv"))
    assert code == 2 and "nope.csv: no such Nsight Compute CSV" in err


def test_no_runtime_table_keeps_the_steps_and_says_how_they_were_mapped(tmp_path):
    a = analyze(sqlite_copy(tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME"))
    assert a.window["basis"] == "nvtx steps" and a.window["warmup_steps"] == [0]
    assert any("mapped onto the GPU by time" in h for h in a.health)
    assert a.gpu_busy_pct > 90
    run = training_run(lambda i: f"step {i}")
    run.calls = []  # a trace without the runtime API's calls
    a = analyze(write_torch(run, tmp_path / "t.json"))
    assert a.window["steps"] == [1, 2, 3, 4, 5] and any("mapped onto the GPU by time" in h for h in a.health)


def test_subprocess_never_prints_a_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    proc = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and str(bad) in proc.stderr


def refuses_or_reads(path: Path) -> None:
    """The contract of analyze() on damaged input: a result, or ProfileError naming the file."""
    try:
        result = analyze(path)
    except ProfileError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    assert result.top_kernels or result.health


TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "StringIds",
    "OSRT_API",
    "META_DATA_CAPTURE",
    "META_DATA_EXPORT",
    "TARGET_INFO_GPU",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)
COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("demangledName", "shortName", "globalPid", "gridX", "end"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("srcKind", "bytes", "copyKind"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("correlationId", "nameId", "globalTid"),
    "NVTX_EVENTS": ("text", "textId", "globalTid", "eventType"),
    "OSRT_API": ("nameId",),
    "StringIds": ("value",),
}


@pytest.mark.parametrize("table", TABLES)
def test_fuzz_nsys_dropped_tables(tmp_path, table):
    refuses_or_reads(sqlite_copy(tmp_path, f"DROP TABLE {table}"))


@pytest.mark.parametrize("table,column", [(t, c) for t, cs in COLUMNS.items() for c in cs])
def test_fuzz_nsys_dropped_columns(tmp_path, table, column):
    path = tmp_path / "profile.sqlite"
    shutil.copy(CLEAN, path)
    con = sqlite3.connect(path)
    # DROP COLUMN refuses indexed columns: rebuild the table without it.
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})") if r[1] != column]
    con.executescript(
        f"CREATE TABLE tmp AS SELECT {', '.join(cols)} FROM {table}; DROP TABLE {table}; "
        f"ALTER TABLE tmp RENAME TO {table};"
    )
    con.close()
    refuses_or_reads(path)


def test_fuzz_nsys_truncated(tmp_path):
    data = CLEAN.read_bytes()
    for size in (0, 100, 4096, 50_000, len(data) // 3, len(data) // 2, len(data) - 4096):
        path = tmp_path / f"cut{size}.sqlite"
        path.write_bytes(data[:size])
        refuses_or_reads(path)


def test_fuzz_torch_events_missing_keys(tmp_path):
    run = training_run(lambda i: f"step {i}")
    events = json.loads(write_torch(run, tmp_path / "t.json").read_text())["traceEvents"]
    rng = random.Random(0)
    for trial in range(30):
        broken = json.loads(json.dumps(events))
        for e in rng.sample(broken, k=len(broken) // 3):
            for key in rng.sample(sorted(e), k=rng.randint(1, 3)):
                if rng.random() < 0.7:
                    del e[key]
                else:
                    e[key] = rng.choice([None, "x", [], {}, -1])
        path = tmp_path / f"fuzz{trial}.json"
        path.write_text(json.dumps({"traceEvents": broken}))
        refuses_or_reads(path)


def test_fuzz_torch_truncated(tmp_path):
    text = (DATA / "clean" / "torch_trace.json").read_text()
    for size in (0, 10, len(text) // 2, len(text) - 10):
        path = tmp_path / f"cut{size}.json"
        path.write_text(text[:size])
        refuses_or_reads(path)
        gz = tmp_path / f"cut{size}.json.gz"
        gz.write_bytes(gzip.compress(text.encode())[: max(0, size // 10)])
        refuses_or_reads(gz)
