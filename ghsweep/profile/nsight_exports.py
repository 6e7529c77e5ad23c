"""A finished Nsight report turned into the file the analysis reads: an nsys report's SQLite export,
an ncu report's metrics as CSV, each by the tool's own exporter, run where the report was made (under
a container's prefix). The command lines that record them: ghsweep.capture.nsight_commands.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from ghsweep.core.errors import ProfilerUnavailable


def export_sqlite(nsys: str, report: Path, prefix: Sequence[str] = (), timeout_s: float = 1800) -> Path:
    """Export an .nsys-rep to SQLite beside it (nsys's own exporter, run under `prefix`, e.g. the
    container the report was made in) and return its path."""
    out = report.with_suffix(".sqlite")
    proc = subprocess.run(
        [*prefix, nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={out}", str(report)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0 or not out.exists():
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ProfilerUnavailable(f"nsys export of {report} failed: {detail[-1] if detail else proc.returncode}")
    return out


def ncu_raw_csv(ncu: str, report: Path, out_csv: Path, prefix: Sequence[str] = (), timeout_s: float = 600) -> Path:
    """`ncu --import REPORT --csv --page raw` (under `prefix`) written to `out_csv`: every metric of every kernel."""
    proc = subprocess.run(
        [*prefix, ncu, "--import", str(report), "--csv", "--page", "raw"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise ProfilerUnavailable(f"ncu --import {report} failed: {proc.stderr.strip()[-300:]}")
    out_csv.write_text(proc.stdout)
    return out_csv
