"""Where the time of a profiled run went: one ProfileAnalysis (result.py; the `--json` of
`python -m ghsweep.analyze`), from an nsys SQLite export, an .nsys-rep (exported first when nsys is
here) or a PyTorch-profiler Chrome trace, plus findings in words (findings.py).

Definitions (the same for every source):
- window: the steady-state steps, projected onto the GPU (steps.py: named ranges of the common
  conventions, else steps inferred from the repeating GPU work; slow leading warm-up steps
  excluded); the whole trace only when neither exists, and then every statement says so.
- gpu_busy_pct: union of kernel, memcpy and memset time on the device over the window (never a
  sum of per-stream times); gpu_idle_pct = 100 - busy.
- kernel/memcpy/memset_time_pct: shares of the summed durations of GPU operations (how nsys's
  timeline and the seed talk's "99.5% kernels vs 0.5% memory" count them).
- exposed_memcpy_pct: time a copy runs with no kernel running, over the window.
- um_migration_pct: unified-memory migrations' share of memory-operation time.
- nccl_time_pct / exposed_nccl_pct (runs on several GPUs): NCCL kernels' share of kernel time, and
  the time NCCL kernels run with no compute kernel on the device, over the window.
"""

from __future__ import annotations

from pathlib import Path

from ghsweep.capture.nsight_commands import find_tool
from ghsweep.core.errors import ProfileError, ProfilerUnavailable
from ghsweep.profile.nsight_exports import export_sqlite
from ghsweep.profile.nsys_analysis import analyze_nsys
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.torch_trace import analyze_torch_trace


def analyze(path: Path, nsys_path: str | None = None) -> ProfileAnalysis:
    """Analyse a profile file; the type is told by its name (.sqlite, .nsys-rep, .json[.gz]).
    ProfileError (or ProfilerUnavailable for an .nsys-rep without nsys) when it cannot be."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    name = path.name
    if name.endswith(".sqlite"):
        return analyze_nsys(path)
    if name.endswith(".nsys-rep"):
        nsys = find_tool("nsys", nsys_path)
        if nsys is None:
            raise ProfilerUnavailable(
                f"{path}: an .nsys-rep needs nsys to export it to SQLite and nsys is not on "
                "PATH; export it where nsys is (nsys export --type=sqlite) and pass the .sqlite"
            )
        sqlite = path.with_suffix(".sqlite")
        if not sqlite.exists() or sqlite.stat().st_mtime < path.stat().st_mtime:
            export_sqlite(nsys, path)
        return analyze_nsys(sqlite)
    if name.endswith((".json", ".json.gz")):
        return analyze_torch_trace(path)
    raise ProfileError(
        f"{path}: not a profile this tool reads; accepted: .sqlite (nsys export), .nsys-rep, "
        ".json or .json.gz (PyTorch profiler trace)"
    )
