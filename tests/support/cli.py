"""Running `python -m ghsweep ARGS` the way a user does, and what the user sees of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ghsweep.launch.provenance import CODE_ENV


def cli_env(env: dict[str, str] | None) -> dict[str, str]:
    """This process's environment with `env` added (or replacing), Hydra's errors as the user sees them.
    A sweep's code identity that an in-process test of the sweep's start left here is not handed on: each
    command works out its own, as a user's does."""
    inherited = {k: v for k, v in os.environ.items() if k != CODE_ENV}
    return dict(inherited, HYDRA_FULL_ERROR="0", **(env or {}))


def run_cli(
    args: list[str], cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m ghsweep ARGS` in `cwd` to its end, output captured; `env` as in cli_env."""
    return subprocess.run(
        [sys.executable, "-m", "ghsweep", *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, merge_stderr: bool = False
) -> subprocess.Popen:
    """Start `python -m ghsweep ARGS` in `cwd` and return while it runs, stdout and stderr piped
    (stderr into stdout when `merge_stderr`, for a test that reads one stream line by line)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ghsweep", *args],
        cwd=cwd,
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
    )


def assert_one_line_errors(stdout: str, stderr: str) -> None:
    """What a user sees of a failure: lines, never a Python traceback."""
    assert "Traceback" not in stdout + stderr, (stdout + stderr)[-3000:]
