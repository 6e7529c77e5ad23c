"""Override values that a shell would act on (metacharacters, newlines, 10,000 characters, non-ASCII)
stay values: the worker command is an argument list, so the dry run's command line, split as a
shell splits it, gives each value back whole, and nothing is executed. A value Hydra cannot parse
is one line naming the override."""

from __future__ import annotations

import shlex

import pytest

from ghsweep.config.validate import validate_launch
from ghsweep.core.errors import ConfigError
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.compose import compose_config

VALUES = {
    "SHELL": "$(touch PWNED); `touch PWNED2` | rm -rf ~ && echo 'q\" > PWNED3",
    "NEWLINE": "line1\nline2; touch PWNED4",
    "LONG": "x" * 10_000,
    "UNICODE": "héllo ☃ 日本語 \u202e",
}
# Through Hydra's quoted-string syntax, the way a value with such characters is given.
OVERRIDES = [
    f"+container.env.{name}='" + value.replace("\\", "\\\\").replace("'", "\\'") + "'" for name, value in VALUES.items()
]


def worker_commands(stdout: str) -> list[str]:
    """The printed worker commands; a quoted newline continues one onto the next line."""
    return [part.split("\n  launch:  ", 1)[0] for part in stdout.split("\n  worker:  ")[1:]]


@pytest.mark.parametrize("launcher", ["local", "local_slurm"])  # a SLURM dry run needs no SLURM
def test_values_stay_whole_arguments_of_the_worker_command(tmp_path, launcher):
    proc = run_cli(
        ["-m", f"hydra/launcher={launcher}", "experiment=smoke", "dry_run=true", "container.image=img.sif", *OVERRIDES],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    [line] = worker_commands(proc.stdout)
    argv = shlex.split(line)
    for name, value in VALUES.items():
        assert argv[argv.index(f"{name}={value}") - 1] == "--env"
    assert argv[-3:-1] == ["-m", "ghsweep.train.worker"]
    assert not list(tmp_path.rglob("PWNED*"))
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    "override, shown",
    [
        ("+notes.a=$(touch PWNED)", "+notes.a=$(touch PWNED)"),
        ("+notes.b=line1\nline2", "+notes.b=line1\\nline2"),
        ("+notes.c=héllo☃", "+notes.c=héllo☃"),
        ("+notes.d=" + "x(" * 5000, "+notes.d=" + ("x(" * 5000)[:191] + "... (10009 characters)"),
        ("+db.password=hun(ter2", "+db.password=***"),
    ],
)
def test_an_override_hydra_cannot_parse_is_one_line_naming_it(tmp_path, override, shown):
    proc = run_cli(["-m", "experiment=smoke", override], tmp_path)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"ghsweep: override {shown} cannot be parsed"), line
    assert line.endswith(
        """quote a value with spaces, brackets, quotes, $, newlines or non-ASCII characters: 'key="value"'"""
    )
    assert "hun(ter2" not in line and len(line) < 800
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "override, shown, problem",
    [
        (
            "+hydra.launcher.additional_parameters.comment='ok\ntouch PWNED'",
            "additional_parameters.comment=ok\\ntouch PWNED",
            "a line break",
        ),
        ("hydra.launcher.partition='gh\rx'", "partition=gh\\rx", "a line break"),
        ("+hydra.launcher.account='a\x00b'", "account=a\\x00b", "a NUL character"),
        ("+hydra.launcher.qos='high\"'", 'qos=high"', "an unbalanced quote"),
        ("hydra.launcher.setup=['echo a','echo b\necho c']", "setup[1]=echo b\\necho c", "a line break"),
    ],
    ids=["comment newline", "partition carriage return", "account NUL", "qos quote", "setup item of two lines"],
)
def test_a_launcher_value_that_is_not_one_token_is_refused(override, shown, problem):
    cfg = compose_config("hydra/launcher=gh200", "experiment=smoke", override, hydra=True)
    with pytest.raises(ConfigError) as refused:
        validate_launch(cfg, "ghsweep")
    assert str(refused.value).startswith(f"hydra.launcher.{shown}: holds {problem}, and it is written into the batch")
    assert "\n" not in str(refused.value)


def test_launcher_values_of_one_token_and_setup_lines_pass():
    cfg = compose_config(
        "hydra/launcher=gh200",
        "+hydra.launcher.additional_parameters.comment='sweep \"a b\"'",
        "hydra.launcher.setup=['module load cuda && echo \"a b\"']",
        hydra=True,
    )
    validate_launch(cfg, "ghsweep")


def test_an_injected_sbatch_line_from_the_environment_is_refused_in_the_dry_run(tmp_path):
    # A site profile's ${oc.env:...}: the value arrives whole, newline included.
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=local_slurm",
            "experiment=smoke",
            "dry_run=true",
            "+hydra.launcher.additional_parameters.comment=${oc.env:SITE_COMMENT}",
        ],
        tmp_path,
        env={"SITE_COMMENT": "ok\ntouch PWNED"},
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("ghsweep: hydra.launcher.additional_parameters.comment=ok\\ntouch PWNED: holds a line break")
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not list(tmp_path.rglob("PWNED*")) and not (tmp_path / "mlflow.db").exists()
