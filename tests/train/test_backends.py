"""The backend registry: every registered module is light to import (the submitting process asks it
about a config before any GPU time), and each backend's check() refuses what it cannot run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ghsweep.config.schema import choices
from ghsweep.core.errors import ConfigError
from ghsweep.train.backends import BACKENDS, backend_named
from tests.support.compose import compose_typed

HEAVY = ("torch", "transformers", "peft", "nemo", "nemo_automodel", "lightning", "matplotlib")


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_registered_backend_loads_no_training_library(name):
    code = (
        f"import json, sys; from ghsweep.train.backends import backend_named; b = backend_named({name!r}); "
        f"print(json.dumps([b.name, sorted(m for m in {HEAVY!r} if m in sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [name, []]


def test_the_registry_holds_the_backends_the_schema_accepts():
    assert tuple(BACKENDS) == choices("backend")


def test_an_unknown_backend_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"^backend=jax: not a known backend; accepted: torch, nemo, automodel$"):
        backend_named("jax")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "nemo",
            "backend=nemo: training needs an NVIDIA GPU (Megatron) and this run has none (device=cpu); "
            "accepted here: backend=torch",
        ),
        (
            "automodel",
            "backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL) and this run has none "
            "(device=cpu); accepted here: backend=torch",
        ),
    ],
)
def test_nemo_and_automodel_need_a_gpu(name, message):
    config = compose_typed(f"backend={name}", "device=cpu")
    with pytest.raises(ConfigError) as err:
        backend_named(name).check(config, on_gpu=False)
    assert str(err.value) == message
    backend_named(name).check(config, on_gpu=True)


def test_check_runs_the_backend_s_own_refusals_first():
    with pytest.raises(ConfigError, match=r"^data.packing_mask=causal: NeMo's packed sequences"):
        backend_named("nemo").check(compose_typed("backend=nemo", "data.packing_mask=causal"), on_gpu=True)
    with pytest.raises(ConfigError, match=r"^offload=on: AutoModel offloads parameters"):
        backend_named("automodel").check(compose_typed("backend=automodel", "offload=on"), on_gpu=True)


def test_describe_is_what_the_dry_run_adds(tmp_path):
    assert backend_named("torch").describe(compose_typed(), tmp_path) == ""
    backend_named("torch").check(compose_typed("device=cpu"), on_gpu=False)
    described = backend_named("automodel").describe(compose_typed("backend=automodel"), tmp_path)
    assert described.startswith(f"  recipe:  AutoModel TrainFinetuneRecipeForNextTokenPrediction, {tmp_path}/")
    refused = backend_named("automodel").describe(compose_typed("backend=automodel", "precision=fp16"), tmp_path)
    assert refused.startswith("  recipe:  (not runnable) precision=fp16: AutoModel trains in one dtype")
