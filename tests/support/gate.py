"""Running the regression gate, `python -m ghsweep.gate ARGS`: as its CLI, or its main in this process
for a test of what main decides (the same exit status and output, without an interpreter's start)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

# By this name in `gate`: its tests are in the quick tier, which tests/support/tiers.py reads off the names
# a test's code uses (`subprocess` is one that starts processes).
from subprocess import CompletedProcess

from ghsweep.gate import main


def gate_cli(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """`python -m ghsweep.gate ARGS` run in `cwd`, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "ghsweep.gate", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def gate(cwd: Path, *args: str | Path) -> CompletedProcess:
    """What `gate_cli` gives, from ghsweep.gate's main called in this process from `cwd`: its exit status
    (argparse's refusals included) and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(map(str, args)))
        except SystemExit as refused:  # argparse's one-line refusals
            status = refused.code
    return CompletedProcess(["ghsweep.gate", *map(str, args)], status, out.getvalue(), err.getvalue())
