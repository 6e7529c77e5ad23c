"""docs/ci.md's recipe runs as written: the GitHub Actions and GitLab CI jobs give the same commands as
the page, and those commands (the sweep, the reference made with --write, the gate) pass, from a
directory that is a user's repository (no reference yet, no ci/ folder)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.cli import cli_env
from tests.support.gate import gate
from tests.support.paths import REPO

PAGE = (REPO / "docs" / "ci.md").read_text()


def ghsweep_commands(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip().startswith("python -m ghsweep")]


def block_after(heading: str) -> list[str]:
    """The lines of the first indented code block under `heading`."""
    section = PAGE.split(f"\n## {heading}\n", 1)[1]
    block = re.search(r"\n\n((?:    .*\n)+)", section)
    assert block, heading
    return block.group(1).splitlines()


def yaml_blocks() -> list[dict]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", PAGE, re.S)]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """The sweep as a command; the gate's commands from its main in this process (its CLI:
    tests/gate/test_gate.py), a `python -m ghsweep.gate` start less each."""
    words = shlex.split(command)
    assert words[:2] == ["python", "-m"], command
    if words[2] == "ghsweep.gate":
        return gate(cwd, *words[3:])
    return subprocess.run(
        [sys.executable, *words[1:]], cwd=cwd, env=cli_env(None), capture_output=True, text=True, timeout=900
    )


def test_the_jobs_run_the_pages_commands():
    github, gitlab = yaml_blocks()
    steps = [step["run"] for step in github["jobs"]["smoke"]["steps"] if "run" in step]
    job_commands = ghsweep_commands(block_after("The commands"))
    assert len(job_commands) == 2
    assert ghsweep_commands(steps) == job_commands
    assert ghsweep_commands(gitlab["ghsweep-smoke"]["script"]) == job_commands
    assert gitlab["ghsweep-smoke"]["allow_failure"] == {"exit_codes": [3]}
    assert ghsweep_commands(block_after("Make the reference, and refresh it"))[0] == job_commands[0]


def test_the_recipe_makes_its_reference_and_passes_it(tmp_path):
    sweep, gate = ghsweep_commands(block_after("The commands"))
    write = ghsweep_commands(block_after("Make the reference, and refresh it"))[1]
    swept = run(sweep, tmp_path)
    assert swept.returncode == 0, swept.stderr[-3000:]
    written = run(write, tmp_path)
    assert written.returncode == 0, written.stderr
    assert "checks loss" in written.stdout
    gated = run(gate, tmp_path)
    assert gated.returncode == 0, gated.stdout + gated.stderr
    assert "ghsweep.gate: passed: 0 regressions, 0 inconclusive in 2 combinations" in gated.stdout
    assert (tmp_path / "ci-smoke" / "sweep" / "comparison" / "comparison.html").is_file()
