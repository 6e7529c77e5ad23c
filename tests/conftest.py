"""Fixtures and hooks every test folder shares (the helpers tests import are in tests/support/)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.tiers import TIERS, no_processes, tier_of

# MLflow's usage telemetry stays off in every client the tests start, in this process and the CLI
# runs, workers and servers that inherit its environment.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

# One compute thread per process: the tests run side by side on every core (pytest-xdist), and so do the
# CLI runs and workers they start; OpenMP's threads of oversubscribed processes then wait on each other
# (a smoke run's step took 4.1 s with torch's two threads on a loaded 2-core machine, 0.23 s with one).
# The processes started inherit the variable; this one is set directly, torch being imported already.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Without CUDA, Triton kernels (ghsweep/train/adamw_kernel.py) run in Triton's interpreter, on CPU
# tensors. It must be chosen before triton is first imported: triton.jit reads it as it decorates.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real 2x2 smoke sweep on CPU, shared by the tests that inspect its results."""
    cwd = tmp_path_factory.mktemp("smoke_sweep")
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32,bf16", "offload=off,on"], cwd)
    return cwd, proc


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 for the whole test session."""
    from ghsweep.tracking.server import start_server

    server = start_server(tmp_path_factory.mktemp("mlflow_server"), port=free_port())
    yield server
    server.stop()


# The session fixtures several modules share: the modules whose tests use one run on one worker, so it is
# made once (the SLURM cluster and the MLflow server its tests log to share a worker; so does the smoke sweep).
SHARED_FIXTURE_GROUPS = {
    "slurm_cluster": "cluster_and_server",
    "mlflow_server": "cluster_and_server",
    "smoke_sweep": "smoke_sweep",
}
# The longest module (~10 min of SLURM jobs on 2 cores) starts first, so it does not run on alone at the end.
FIRST_MODULE = "tests/launch/test_slurm.py"


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


UNGROUPED: list[str] = []  # why the tests cannot run here, when pytest-xdist's groups did not take


def pytest_collection_finish(session):
    """pytest-xdist marks a grouped test by appending "@group" to its id, which pytest 9.2 no longer
    lets it do (pyproject.toml pins pytest below it); without the groups a module's fixtures (the
    SLURM cluster) start on several workers at once. Every test then fails, saying so."""
    if getattr(session.config.option, "loadgroup", False) and not any("@" in i.nodeid for i in session.items):
        UNGROUPED.append(
            f"pytest-xdist did not group the tests under pytest {pytest.__version__}; install the test "
            "extra's pytest (`pip install -e '.[test]'`) or run with `-n 0`"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if UNGROUPED:
        pytest.fail(UNGROUPED[0], pytrace=False)
    return (yield from quick_without_processes(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from quick_without_processes(item))


def quick_without_processes(item):
    """A quick test, and the fixtures it sets up, start no process (tests/support/tiers.py): the tier is
    honest, and one that needs a process fails, saying which marker it needs."""
    if not item.get_closest_marker("quick"):
        return (yield)
    with no_processes(item.nodeid):
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups on its workers
def pytest_collection_modifyitems(config, items):
    """Mark each test's tier; group tests for pytest-xdist; skip GPU tests without CUDA, with the reason,
    never silently.

    With `--dist loadgroup` a module's tests stay on one worker, so its module fixtures (a sweep, a
    browser) are made once, while different modules run side by side; the modules that share a session
    fixture (SHARED_FIXTURE_GROUPS) share a worker. All GPU tests share one worker: one GPU, and
    timings that must not compete with each other.
    """
    import torch

    tiers = {item.nodeid: tier_of(item) for item in items}
    for item in items:
        item.add_marker(tiers[item.nodeid])
    # The costliest tier first, module by module (a module's fixtures are made once), the longest module
    # before all: the short quick tests fill the workers' ends. pyproject.toml's --no-loadscope-reorder
    # keeps this order under pytest-xdist (by default it reorders groups by their number of tests).
    module_rank: dict[str, int] = {}
    for item in items:
        rank = TIERS.index(tiers[item.nodeid])
        module_rank[module_of(item)] = min(rank, module_rank.get(module_of(item), rank))
    items.sort(key=lambda item: (module_of(item) != FIRST_MODULE, module_rank[module_of(item)]))
    module_group = {}
    for item in items:
        for fixture, group in SHARED_FIXTURE_GROUPS.items():
            if fixture in item.fixturenames:
                module_group.setdefault(module_of(item), group)
    for item in items:
        group = "gpu" if item.get_closest_marker("gpu") else module_group.get(module_of(item), module_of(item))
        item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA; run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
