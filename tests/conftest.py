"""Shared fixtures: composing the repo's config and running the real `python -m ghsweep` CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

# Without CUDA, Triton kernels (ghsweep/train/adamw_kernel.py) run in Triton's interpreter, on CPU
# tensors. It must be chosen before triton is first imported: triton.jit reads it as it decorates.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


def sqlite_uri(cwd: Path) -> str:
    """The tracking URI of the MLflow store a CLI run in `cwd` writes by default (./mlflow.db)."""
    return f"sqlite:///{cwd / 'mlflow.db'}"


class MlflowRecords:
    """What ghsweep recorded in one MLflow experiment, read back with MLflow's own client."""

    def __init__(self, tracking_uri: str, experiment: str = "ghsweep"):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id

    def runs(self, role: str) -> list:
        """The runs tagged `ghsweep.role` = `role`: "sweep" (a sweep's parent) or "run" (one combination)."""
        return self.client.search_runs([self.experiment_id], filter_string=f"tags.`ghsweep.role` = '{role}'")


def compose_config(*overrides: str, hydra: bool = False) -> DictConfig:
    """The config `python -m ghsweep OVERRIDES` composes (with the `hydra` node when `hydra`)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def run_cli(
    args: list[str], cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m ghsweep ARGS` in `cwd` the way a user would, output captured; `env` adds to
    (or replaces in) this process's environment."""
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", HYDRA_FULL_ERROR="0", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ghsweep", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real 2x2 smoke sweep on CPU, shared by the tests that inspect its results."""
    cwd = tmp_path_factory.mktemp("smoke_sweep")
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32,bf16", "offload=off,on"], cwd)
    return cwd, proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 for the whole test session."""
    from ghsweep.tracking.server import start_server

    server = start_server(tmp_path_factory.mktemp("mlflow_server"), port=free_port())
    yield server
    server.stop()


# Modules whose tests share the session's smoke sweep: one worker runs them, so the sweep runs once.
SMOKE_SWEEP_MODULES = {"tests/launch/test_sweep.py", "tests/report/test_cli.py"}
# The longest module (~10 min of SLURM jobs on 2 cores) starts first, so it does not run on alone at the end.
FIRST_MODULE = "tests/launch/test_slurm.py"


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


def pytest_runtest_setup(item):
    if UNGROUPED:
        pytest.fail(UNGROUPED[0], pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups on its workers
def pytest_collection_modifyitems(config, items):
    """Group tests for pytest-xdist; skip GPU tests without CUDA, with the reason, never silently.

    With `--dist loadgroup` a module's tests stay on one worker, so its module fixtures (a sweep, a
    browser, the SLURM cluster) are made once, while different modules run side by side. All GPU
    tests share one worker: one GPU, and timings that must not compete with each other.
    """
    import torch

    items.sort(key=lambda item: not item.nodeid.startswith(FIRST_MODULE + "::"))
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        group = "gpu" if "gpu" in item.keywords else "smoke_sweep" if module in SMOKE_SWEEP_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA; run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
