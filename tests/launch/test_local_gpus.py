"""Which GPUs a local submitit sweep places its combinations on, and in which sets."""

from __future__ import annotations

import pytest
import torch

from ghsweep.core.gpu import visible_gpu_handles
from ghsweep.launch.local_gpus import gpu_sets, several_gpus_hint, sweep_gpus
from tests.support.cli import run_cli
from tests.support.compose import hydra_on_conf, launch_config


def test_gpus_are_cut_into_one_set_per_combination_running_at_once():
    assert gpu_sets([0, 1, 2, 3], 1) == [(0,), (1,), (2,), (3,)]
    assert gpu_sets([4, 5, 6], 2) == [(4, 5)]  # GPU 6 alone cannot hold a combination of two
    assert gpu_sets([0], 2) == []


def test_the_sweep_takes_the_gpus_cuda_visible_devices_lists_by_their_numbers(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert sweep_gpus() == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CUDA hidden: every combination on the CPU
    assert sweep_gpus() == []


def test_without_gpus_the_sweep_places_nothing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if visible_gpu_handles():
        pytest.skip("this machine has GPUs: test_every_gpu_of_the_machine_when_none_is_listed covers it")
    assert sweep_gpus() == []


@pytest.mark.gpu
def test_every_gpu_of_the_machine_when_none_is_listed(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # On a machine where no other process computes (this one's own CUDA context does not count).
    torch.zeros(1, device="cuda")
    assert sweep_gpus() == list(range(torch.cuda.device_count()))


HINT = (
    "2 combinations run one after another on this machine's first GPU; "
    "hydra/launcher=submitit_local runs one per GPU at once on GPUs 0,1"
)
SWEEP = ["experiment=smoke", "precision=fp32,bf16", "dry_run=true"]


def test_a_sweep_run_one_at_a_time_on_several_gpus_says_how_to_use_them_all(monkeypatch):
    # Stand-in GPUs: the hint reads the GPUs the sweep would place on, as submitit_local would.
    with hydra_on_conf():
        one_at_a_time = launch_config(*SWEEP, sweep=True)
        placed = launch_config(*SWEEP, "hydra/launcher=submitit_local", sweep=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert several_gpus_hint(one_at_a_time, 2) == HINT
    assert several_gpus_hint(placed, 2) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert several_gpus_hint(one_at_a_time, 2) is None


def test_the_hint_is_printed_as_the_sweep_starts(tmp_path):
    assert f"ghsweep: {HINT}" in run_cli(["-m", *SWEEP], tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1"}).stdout
