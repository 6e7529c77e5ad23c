"""The sweep directory a sweep claims: one it cannot write is a directory problem, said so in one line;
and what the command says first, before the seconds of composing and opening MLflow."""

from __future__ import annotations

import pytest

from ghsweep.__main__ import starting_line
from ghsweep.core.errors import SweepDirUnwritable
from ghsweep.launch.sweep_manifest import SweepManifest
from tests.support.cli import assert_one_line_errors, run_cli


def test_a_sweep_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SweepDirUnwritable, match=r"a_file/sweep: the sweep directory cannot be written \(Not a dir"):
        SweepManifest.claim(tmp_path / "a_file" / "sweep", "this test")


def test_the_cli_says_what_it_starts_then_names_the_directory(tmp_path):
    (tmp_path / "a_file").write_text("")
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32,bf16", "hydra.sweep.dir=a_file/sweep"], tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == starting_line(["-m"])
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: hydra.sweep.dir=a_file/sweep: the sweep directory cannot be written (Not a directory: "
        "a_file/sweep); set hydra.sweep.dir to a directory you can write"
    )
    assert "MLflow run could not be created" not in proc.stderr
    assert_one_line_errors(proc.stdout, proc.stderr)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["experiment=smoke"], "ghsweep: starting the run: checking the config, opening MLflow, then training"),
        (["-m", "precision=fp32,bf16", "dry_run=true"], "ghsweep: dry run of the sweep: planning each combination"),
        (["--cfg", "job"], None),  # prints the config alone
        (["--help"], None),
    ],
)
def test_the_first_line_says_what_the_command_does(argv, said):
    line = starting_line(argv)
    assert line == said if said is None else line is not None and line.startswith(said) and len(line) <= 120
