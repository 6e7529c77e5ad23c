"""Unknown keys and group options are refused before Hydra composes, with the closest known one: a
typo (`train.max_step=3`), the same typo appended (`+train.max_step=3`, which Hydra's own hint leads
to and nothing would read), and a typo inside a sweep list (`precision=fp32,bf61`)."""

from __future__ import annotations

import pytest

from ghsweep.config.keys import did_you_mean, is_known, known_keys, options
from ghsweep.launch.overrides import refusals
from tests.support.cli import assert_one_line_errors, run_cli


def test_every_key_of_the_groups_presets_and_launch_profiles_is_known():
    keys = known_keys()
    assert {"train.max_steps", "precision.library", "tune.trials", "tracking.server_uri", "container.env"} <= set(keys)
    assert not any(k == "hydra" or k.startswith("hydra.") for k in keys)
    # Maps the user fills: any name inside them is known.
    assert is_known("container.env.MY_VAR") and is_known("tune.max.step_time_ms")
    assert not is_known("train.max_step") and not is_known("train.max_steps.x")
    assert options("precision") == ["bf16", "fp16", "fp32", "fp8"]
    assert options("train") == []


@pytest.mark.parametrize(
    "override, line",
    [
        ("train.max_step=3", "train.max_step=3: no such key; did you mean train.max_steps?"),
        (
            "+train.max_step=3",
            "+train.max_step=3: train.max_step is not a key ghsweep reads, so it would be ignored; "
            "did you mean train.max_steps?",
        ),
        (
            "++trian.max_steps=3",
            "++trian.max_steps=3: trian.max_steps is not a key ghsweep reads, so it would be ignored; "
            "did you mean train.max_steps?",
        ),
        (
            "precision=fp32,bf61",
            "precision=fp32,bf61: precision has no option bf61; accepted: bf16, fp16, fp32, fp8; "
            "did you mean precision=bf16?",
        ),
        ("offload=of", "offload=of: offload has no option of; accepted: off, on; did you mean offload=off?"),
        ("qwertyuiop=1", "qwertyuiop=1: no such key; `python -m ghsweep --cfg job` lists the keys"),
        # A group, not one of its keys (precision.name).
        ("precison=bf16", "precison=bf16: no such key; did you mean precision=bf16?"),
        (
            "hydra/launcher=gh2000",
            "hydra/launcher=gh2000: hydra/launcher has no option gh2000; accepted: basic, gh200, ghsweep_basic, "
            "ghsweep_slurm, local, local_slurm, submitit_local, submitit_slurm; did you mean hydra/launcher=gh200?",
        ),
        (
            "hydra/sweeper=tuen",
            "hydra/sweeper=tuen: hydra/sweeper has no option tuen; accepted: basic, tune; "
            "did you mean hydra/sweeper=tune?",
        ),
        (  # conf/ adds ghsweep's to the files Hydra ships
            "hydra/job_logging=disabld",
            "hydra/job_logging=disabld: hydra/job_logging has no option disabld; accepted: default, disabled, "
            "ghsweep, none, stdout; did you mean hydra/job_logging=disabled?",
        ),
    ],
)
def test_a_mistake_is_one_line_with_the_closest_known_key(override, line):
    assert refusals([override]) == [line]


@pytest.mark.parametrize(
    "override",
    [
        "train.max_steps=3",
        "precision=fp32,bf16",
        "experiment=smoke",
        "experiment=null",
        "+container.env.MSG=hi",  # a map the user fills
        "+tune.max.step_time_ms=400",
        "+tracking.password=${oc.env:DB_PASSWORD}",  # a secret, for an interpolation to read
        "+notes.purpose=baseline",  # a section of the user's own, recorded with the run's params
        "+train.extra=1 model.path=/m/${train.extra}",  # read through an interpolation
        "hydra/launcher=basic",  # Hydra's own options of the groups conf/ adds to
        "hydra/sweeper=basic",
        "hydra/launcher=submitit_local hydra/sweeper=tune",
        "hydra/job_logging=disabled",  # Hydra checks its own groups
        "~train.grad_clip",
    ],
)
def test_what_is_known_or_meant_passes(override):
    assert refusals(override.split(" ")) == []


def test_without_a_close_key_it_says_where_keys_are_listed():
    assert did_you_mean("zzzzzz") == "; `python -m ghsweep --cfg job` lists the keys"


def test_the_cli_refuses_every_mistake_at_once_before_anything_is_created(tmp_path):
    proc = run_cli(
        ["-m", "train.max_step=3", "+train.max_step=3", "precision=fp32,bf61", "hydra/sweeper=tuen"], tmp_path
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "ghsweep: train.max_step=3: no such key; did you mean train.max_steps?",
        "ghsweep: +train.max_step=3: train.max_step is not a key ghsweep reads, so it would be ignored; "
        "did you mean train.max_steps?",
        "ghsweep: precision=fp32,bf61: precision has no option bf61; accepted: bf16, fp16, fp32, fp8; "
        "did you mean precision=bf16?",
        "ghsweep: hydra/sweeper=tuen: hydra/sweeper has no option tuen; accepted: basic, tune; "
        "did you mean hydra/sweeper=tune?",
    ]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not list(tmp_path.iterdir())


def test_a_launch_profile_on_the_users_search_path_is_an_option(tmp_path):
    # A site's profile in a folder of its own (hydra.searchpath) is as real as conf/'s; a near miss of it
    # is still refused, with it as the suggestion.
    (tmp_path / "hydra" / "launcher").mkdir(parents=True)
    (tmp_path / "hydra" / "launcher" / "mysite.yaml").write_text("# @package hydra.launcher\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    assert refusals([searchpath, "hydra/launcher=mysite"]) == []
    (line,) = refusals([searchpath, "hydra/launcher=mysitee"])
    assert line.startswith("hydra/launcher=mysitee: hydra/launcher has no option mysitee; accepted: ")
    assert line.endswith("did you mean hydra/launcher=mysite?")
