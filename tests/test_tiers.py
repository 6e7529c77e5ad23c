"""Each test's tier comes from what it needs (tests/support/tiers.py, marked in tests/conftest.py), and
the quick tier is honest: a quick test that starts a process fails."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.support.cli import run_cli
from tests.support.slurm_sweeps import sweep_args
from tests.support.tiers import ProcessInQuickTest, names_used, tier_needed


def reads_a_file(path):
    return path.read_text()


def runs_the_cli(tmp_path):
    return run_cli(["--help"], tmp_path)


def through_a_helper(tmp_path):
    return runs_the_cli(tmp_path)


def starts_a_command():
    return subprocess.run(["true"], check=True)


def builds_slurm_arguments(server):
    return sweep_args(server, "experiment")


@pytest.mark.parametrize(
    "function, tier",
    [
        (reads_a_file, "quick"),
        (runs_the_cli, "cli"),
        (through_a_helper, "cli"),  # a helper of tests/ is followed to what it calls
        (starts_a_command, "cli"),
        (lambda: os.fork(), "cli"),
        (builds_slurm_arguments, "quick"),  # a helper beside the cluster's, not the cluster
    ],
)
def test_a_tests_tier_is_what_its_code_needs(function, tier):
    assert tier_needed(names_used([function])) == tier


def test_the_fixtures_of_a_test_decide_its_tier_too(request):
    fixtures = request.session._fixturemanager
    for fixture, tier in [("smoke_sweep", "cli"), ("mlflow_server", "systems"), ("tmp_path", "quick")]:
        [definition] = fixtures.getfixturedefs(fixture, request.node)
        assert tier_needed(names_used([definition.func])) == tier, fixture


@pytest.mark.quick  # by hand: its code names processes, to start them
def test_this_test_is_quick_and_cannot_start_a_process(request):
    assert request.node.get_closest_marker("quick")
    with pytest.raises(ProcessInQuickTest, match=r"test_tiers.py::test_this_test_is.* mark it @pytest.mark.cli"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(ProcessInQuickTest):
        os.system("true")
    with pytest.raises(ProcessInQuickTest):
        multiprocessing.get_context("spawn").Process(target=print).start()
    # Not an Exception: code under test that catches a failed command must not swallow it.
    assert not issubclass(ProcessInQuickTest, Exception)


@pytest.mark.cli
def test_a_test_marked_cli_may_start_one():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
