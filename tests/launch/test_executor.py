"""ghsweep's submitit executor (ghsweep.launch.slurm.submitit_launcher.make_executor) against the one
hydra-submitit-launcher's launch() builds for the same launch profile: the same cluster, folder,
constructor settings and job parameters, except where ghsweep asks for a combination's world."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import submitit
from hydra.utils import get_class
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from omegaconf import DictConfig, OmegaConf

from ghsweep.core.run_plan import World
from ghsweep.launch.slurm.submitit_launcher import _ScriptOnlySlurm, make_executor
from tests.optional_env import unavailable
from tests.support.compose import compose_config

# Every launch profile on the plugin's launchers: one local, two SLURM.
PROFILES = ["submitit_local", "gh200", "local_slurm"]
PLUGIN_LAUNCHERS = {"local": plugin.LocalLauncher, "slurm": plugin.SlurmLauncher}


def profile_config(profile: str, tmp_path: Path, *overrides: str) -> DictConfig:
    if shutil.which("srun") is None:
        unavailable("submitit's SLURM executor needs srun on PATH (apt-get install slurm-client)")
    return compose_config(f"hydra/launcher={profile}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides, hydra=True)


def launcher_params(cfg: DictConfig) -> dict[str, Any]:
    """The keyword arguments Hydra instantiates the launcher with."""
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(params, dict)
    del params["_target_"]
    return params


def cluster_of(cfg: DictConfig) -> str:
    return get_class(cfg.hydra.launcher._target_)._EXECUTOR


def plugin_executor(cfg: DictConfig, monkeypatch: pytest.MonkeyPatch) -> submitit.AutoExecutor:
    """The executor the plugin's launch() builds for this config, caught where it would submit."""
    built: list[submitit.AutoExecutor] = []

    def catch(executor: submitit.AutoExecutor, *args: Any) -> list:
        built.append(executor)
        return []

    params = launcher_params(cfg)
    params.pop("retries", None)  # ghsweep's key (each job reads it); the plugin would hand it to submitit
    launcher = PLUGIN_LAUNCHERS[cluster_of(cfg)](**params)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    with monkeypatch.context() as patch:
        patch.setattr(submitit.AutoExecutor, "map_array", catch)
        launcher.launch([["seed=1"]], initial_job_idx=0)
    (executor,) = built
    return executor


def settings(executor: submitit.AutoExecutor) -> dict[str, Any]:
    return {
        "cluster": executor.cluster,
        "folder": executor.folder,
        "max_num_timeout": executor._executor.max_num_timeout,
        "parameters": executor._executor.parameters,
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_one_gpu_runs_get_the_plugins_executor(profile, tmp_path, monkeypatch):
    cfg = profile_config(profile, tmp_path)
    ours = make_executor(cluster_of(cfg), launcher_params(cfg), World(), dry_run=False)
    assert settings(ours) == settings(plugin_executor(cfg, monkeypatch))


def test_a_dry_run_without_slurm_builds_the_plugins_slurm_parameters(tmp_path, monkeypatch):
    cfg = profile_config("gh200", tmp_path)
    expected = settings(plugin_executor(cfg, monkeypatch))
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun: SLURM is not installed here
    ours = make_executor("slurm", launcher_params(cfg), World(), dry_run=True)
    assert isinstance(ours._executor, _ScriptOnlySlurm)
    assert settings(ours) == expected


@pytest.mark.parametrize("profile", ["gh200", "local_slurm"])
def test_a_run_on_several_gpus_changes_only_its_nodes_and_tasks(profile, tmp_path, monkeypatch):
    cfg = profile_config(profile, tmp_path)
    expected = settings(plugin_executor(cfg, monkeypatch))
    expected["parameters"].update(nodes=2, ntasks_per_node=4, gpus_per_node=4)
    ours = make_executor("slurm", launcher_params(cfg), World(num_nodes=2, gpus_per_node=4), dry_run=False)
    assert settings(ours) == expected


def test_a_cpu_cluster_profile_asks_for_no_gpus_on_several_nodes(tmp_path, monkeypatch):
    cfg = profile_config("local_slurm", tmp_path, "hydra.launcher.gpus_per_node=null")
    expected = settings(plugin_executor(cfg, monkeypatch))
    expected["parameters"].update(nodes=2, ntasks_per_node=4)
    ours = make_executor("slurm", launcher_params(cfg), World(num_nodes=2, gpus_per_node=4), dry_run=False)
    assert "gpus_per_node" not in ours._executor.parameters
    assert settings(ours) == expected
