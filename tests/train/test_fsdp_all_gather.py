"""backend.fsdp_all_gather: which runs gather FSDP2's weights with the copy engines, and that they train
the same bits as NCCL's kernels (an all-gather copies; it adds nothing). The GPU test needs two GPUs:
`pytest -m gpu tests/train/test_fsdp_all_gather.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ghsweep.config.schema import ConfigSchema
from ghsweep.train import distributed
from tests.support.compose import compose_typed
from tests.support.gloo_ranks import on_ranks
from tests.support.models import TINY_LLAMA

TOKENS = 64
TWO = distributed.Ranks(0, 2, 0)


def test_only_fsdp2_on_several_ranks_gathers_and_auto_takes_the_copy_engines_only_where_they_work():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    copy_engine = compose_typed("peft=none", "backend.fsdp_all_gather=copy_engine")
    assert distributed.fsdp_all_gather(copy_engine, TWO, "fsdp", gpu) == "copy_engine"
    assert distributed.fsdp_all_gather(copy_engine, TWO, "ddp", gpu) is None
    assert distributed.fsdp_all_gather(copy_engine, distributed.Ranks(0, 1, 0), "fsdp", gpu) is None
    assert (
        distributed.fsdp_all_gather(compose_typed("peft=none", "backend.fsdp_all_gather=nccl"), TWO, "fsdp", gpu)
        == "nccl"
    )
    auto = compose_typed("peft=none")
    assert auto.backend.fsdp_all_gather == "auto"
    assert distributed.fsdp_all_gather(auto, TWO, "fsdp", cpu) == "nccl"
    # Across nodes the copy engines gather nothing (NCCL's symmetric kernels would): auto stays with NCCL.
    two_nodes = compose_typed("peft=none", "backend.num_nodes=2")
    assert distributed.fsdp_all_gather(two_nodes, TWO, "fsdp", gpu) == "nccl"
    expected = "copy_engine" if distributed.copy_engine_missing() is None else "nccl"
    assert distributed.fsdp_all_gather(auto, TWO, "fsdp", gpu) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without CUDA GPUs")
def test_copy_engine_without_a_gpu_is_refused_naming_what_is_missing():
    with pytest.raises(
        RuntimeError, match=r"backend.fsdp_all_gather=copy_engine: no CUDA GPU; accepted here: nccl or auto"
    ):
        distributed.start(TWO, torch.device("cpu"), copy_engine=True)


def _rank_steps(ranks, device: torch.device, configs: dict[str, ConfigSchema], out: Path) -> None:
    """One rank: for each of `configs`, the same model and this rank's batch, two optimizer steps under
    FSDP2 (the second step's forward gathers the weights the first updated); rank 0 saves the losses and
    the weights, whole."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ghsweep.train.loss import causal_lm_loss

    seen = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        llama = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, vocab_size=256)).to(device, torch.bfloat16)
        step = distributed.TrainStep(llama.model, llama.lm_head, causal_lm_loss)
        model, _, _ = distributed.parallelize(step, config, ranks, "fsdp")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = torch.randint(0, 256, (1, TOKENS), generator=torch.Generator().manual_seed(100 + ranks.rank))
        losses = []
        for _ in range(2):
            loss = model(batch.to(device), batch.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach().float().cpu())
        weights = {n: p.detach().full_tensor().cpu() for n, p in model.named_parameters()}
        seen[name] = {"losses": losses, "weights": weights}
    if ranks.is_main:
        torch.save(seen, out)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the copy engines' all-gather needs two NVIDIA GPUs")
def test_copy_engine_all_gather_trains_the_same_bits_as_nccls_kernels(tmp_path):
    configs = {
        gather: compose_typed("precision=bf16", "peft=none", f"backend.fsdp_all_gather={gather}")
        for gather in ("nccl", "copy_engine")
    }
    assert distributed.copy_engine_missing() is None
    assert (
        distributed.fsdp_all_gather(compose_typed("peft=none"), TWO, "fsdp", torch.device("cuda", 0)) == "copy_engine"
    )
    out = tmp_path / "steps.pt"
    on_ranks(_rank_steps, 2, configs, out, on_gpu=True, copy_engine=True)
    seen = torch.load(out)
    assert [float(x) for x in seen["copy_engine"]["losses"]] == [float(x) for x in seen["nccl"]["losses"]]
    weights, plain = seen["copy_engine"]["weights"], seen["nccl"]["weights"]
    assert weights.keys() == plain.keys()
    assert [n for n in weights if not torch.equal(weights[n], plain[n])] == []
