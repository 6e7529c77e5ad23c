"""backend=nemo without NeMo: its impossible combinations are one-line errors before submission, and
nothing on the base install's path imports NeMo."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo
from ghsweep.launch.run_planner import checked_config as validate
from tests.support.cli import run_cli
from tests.support.nemo_recipes import nemo_config

H100 = GpuInfo("NVIDIA H100", (9, 0), 80.0, 79.0)


def error_of(cfg, gpu=H100) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_valid_nemo_runs_pass_on_a_gpu():
    validate(nemo_config(), H100)
    validate(nemo_config("model=llama2_7b", "peft=none", "offload=on", "offload.num_layers=8", "dataloader=sync"), H100)


def test_nemo_needs_a_gpu():
    assert error_of(nemo_config(), None) == (
        "backend=nemo: training needs an NVIDIA GPU (Megatron) and this run has none (device=auto); "
        "accepted here: backend=torch"
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model=tiny_llama", "offload=on", "offload.num_layers=4"],
            "offload.num_layers=4: with backend=nemo Megatron offloads fewer layers than model=tiny_llama has (4); "
            "accepted: 1 to 3",
        ),
        (
            [
                "model=llama2_7b",
                "offload=on",
                "backend.recompute_granularity=full",
                "backend.recompute_method=uniform",
                "backend.recompute_num_layers=1",
            ],
            "backend.recompute_granularity=full: Megatron refuses activation recomputation together with offload=on; "
            "accepted with offload=on: null",
        ),
        (
            ["model=llama2_7b", "offload=on", "backend.pipeline_parallel=2", "backend.gpus_per_node=2"],
            "backend.pipeline_parallel=2: Megatron has no CPU offloading with pipeline parallelism; accepted with offload=on: 1",
        ),
        (
            ["backend.recompute_granularity=some"],
            "backend.recompute_granularity=some: not an accepted value; accepted: null, selective, full",
        ),
        (
            ["backend.tensor_parallel=2"],
            "backend.tensor_parallel=2: tensor x pipeline parallel (2) must divide the run's 1 GPUs "
            "(backend.num_nodes x backend.gpus_per_node)",
        ),
        (
            ["peft.target_modules=[q_proj,o_proj]"],
            "peft.target_modules=['o_proj', 'q_proj']: with backend=nemo q_proj, k_proj, v_proj are one fused layer "
            "(linear_qkv) and take LoRA together; accepted: all of them or none",
        ),
        (
            ["dataloader.prefetch_factor=4"],
            "dataloader.prefetch_factor=4: NeMo's data module always uses PyTorch's default; accepted with backend=nemo: null, 2",
        ),
        (
            ["peft=none", "train.optimizer=adamw8bit"],
            "train.optimizer=adamw8bit: NeMo steps Megatron's distributed Adam over fp32 master weights; "
            "accepted with backend=nemo: auto",
        ),
        (
            ["precision=fp8", "precision.library=torchao"],
            "precision.library=torchao: NeMo's fp8 is Transformer Engine's; accepted with backend=nemo: auto, te",
        ),
    ],
)
def test_impossible_nemo_combinations(overrides, message):
    assert error_of(nemo_config(*overrides)) == message


def test_fp8_without_transformer_engine_is_refused_before_the_worker_starts():
    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("Transformer Engine is installed here; this checks an environment without it")
    assert error_of(nemo_config("precision=fp8")) == (
        "precision=fp8: backend=nemo needs Transformer Engine (import transformer_engine) and this environment "
        "has none (the NeMo container has it); accepted here: fp32, fp16, bf16"
    )
    # In a container the worker's packages are the image's: the worker checks them when it starts.
    validate(nemo_config("precision=fp8", "container.image=/images/nemo.sif"), H100)


def test_the_base_install_path_never_imports_nemo():
    code = (
        "import sys, ghsweep.train.worker, ghsweep.config.validate, ghsweep.launch.job, ghsweep.train.nemo.recipe; "
        "print(sorted(m for m in sys.modules if m == 'nemo' or m.startswith(('nemo.', 'nemo_run'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_dry_run_without_nemo_says_where_to_run_it(tmp_path):
    if importlib.util.find_spec("nemo") is not None:
        pytest.skip("NeMo is installed here; test_nemo_dry_run covers the dry run with it")
    proc = run_cli(["backend=nemo", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "worker:" in proc.stdout
    assert "recipe:  (not composed) NeMo does not import here (No module named 'nemo')" in proc.stdout
