"""`python -m ghsweep.report --out FILE` (a file, or a path under one) is exit 2 with one line, before
MLflow is read: no traceback, no store opened or created."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_errors


@pytest.mark.parametrize("out", ["report.html", "report.html/sub"])
def test_a_file_as_the_report_folder_is_one_line(tmp_path, out):
    (tmp_path / "report.html").write_text("an earlier report")
    proc = subprocess.run(
        [sys.executable, "-m", "ghsweep.report", "sweep 2026-11-25/10-00-00", "--out", out],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"ghsweep.report: --out {out}: {tmp_path / 'report.html'} is a file, not a folder; give a folder "
        "(created when missing)"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert (tmp_path / "report.html").read_text() == "an earlier report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
