"""Where a tuning study's report and answer are, and the answer as the sweep's last words.

Apart from the report itself (ghsweep.tune.report), so that the sweep's callback reads the answer
without importing Optuna and matplotlib for every sweep.
"""

from __future__ import annotations

from pathlib import Path

REPORT_DIR = "tune"
REPORT_FILE = "tune.md"
# The command lines that reproduce the best trial (or each trial of the Pareto front), one per line.
ANSWER_FILE = "best.txt"


def print_answer(sweep_dir: Path) -> None:
    """The study's answer as the last lines of the sweep's output (after its summary and comparison);
    SystemExit when no trial finished within the constraints: the command has no answer."""
    best = sweep_dir / REPORT_DIR / ANSWER_FILE
    commands = best.read_text().strip() if best.exists() else ""
    if not commands:
        raise SystemExit(f"ghsweep tune: no trial finished within the constraints ({sweep_dir / REPORT_DIR / REPORT_FILE})")
    print(f"ghsweep tune: the answer ({best}):\n" + "\n".join(f"  {c}" for c in commands.splitlines()), flush=True)
