"""precision.reduce_dtype=auto sums gradients in their own dtype on two ranks: the same bits as the fp32
sum, under DDP and FSDP2 alike (real gloo process groups on CPU, NCCL on two GPUs; a small Llama in
bf16, ghsweep's own parallelize); on four ranks the bf16 sums round after each add and differ, so auto
keeps fp32 there. The GPU test: `pytest -m gpu tests/train/test_reduce_dtype.py` on two GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ghsweep.config.schema import ConfigSchema
from ghsweep.train.distributed import reduce_dtype
from tests.support.compose import compose_typed
from tests.support.gloo_ranks import on_ranks
from tests.support.models import TINY_LLAMA

TOKENS = 64


def _rank_gradients(ranks, device: torch.device, configs: dict[str, ConfigSchema], out: Path) -> None:
    """One rank: for each of `configs` (by name), the same model and this rank's own batch, one forward and
    backward through parallelize; rank 0 saves every parameter's reduced gradient, whole."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ghsweep.train import distributed
    from ghsweep.train.loss import causal_lm_loss

    gradients = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        llama = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, vocab_size=256)).to(device, torch.bfloat16)
        step = distributed.TrainStep(llama.model, llama.lm_head, causal_lm_loss)
        # "own": this rank's gradient, as a world of one trains it.
        alone = distributed.Ranks(0, 1, 0) if name == "own" else ranks
        model, _, _ = distributed.parallelize(step, config, alone, "ddp" if name.startswith("ddp") else "fsdp")
        batch = torch.randint(0, 256, (1, TOKENS), generator=torch.Generator().manual_seed(100 + ranks.rank))
        model(batch.to(device), batch.to(device)).backward()
        # DDP names its module's parameters "module.*"; FSDP2's are DTensors, gathered whole.
        whole = {
            n.removeprefix("module."): getattr(p.grad, "full_tensor", lambda g=p.grad: g)()
            for n, p in model.named_parameters()
        }
        gradients[name] = {n: g.detach().cpu() for n, g in whole.items()}
    if ranks.is_main:
        torch.save(gradients, out)


def reduced_gradients(world: int, tmp_path: Path, on_gpu: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """DDP and FSDP2 on `world` processes (NCCL on as many GPUs `on_gpu`, else gloo), each with gradients
    summed in fp32 and in bf16, and rank 0's own."""
    configs = {
        f"{mode}_{dtype}": compose_typed("precision=bf16", "peft=none", f"precision.reduce_dtype={dtype}")
        for mode in ("ddp", "fsdp")
        for dtype in ("fp32", "param")
    }
    configs["own"] = configs["ddp_fp32"]
    out = tmp_path / f"gradients_{world}.pt"
    on_ranks(_rank_gradients, world, configs, out, on_gpu=on_gpu)
    return torch.load(out)


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys() and all(g.dtype == torch.bfloat16 for g in a.values())
    return [n for n in a if not torch.equal(a[n], b[n])]


def test_auto_is_the_gradients_dtype_on_two_ranks_and_fp32_on_more():
    assert [reduce_dtype("auto", n) for n in (2, 3, 4, 8)] == ["param", "fp32", "fp32", "fp32"]
    assert reduce_dtype("fp32", 2) == "fp32" and reduce_dtype("param", 8) == "param"


def assert_two_ranks_sum_to_fp32s_bits(two: dict[str, dict[str, torch.Tensor]]) -> None:
    assert differing(two["ddp_fp32"], two["ddp_param"]) == []
    assert differing(two["fsdp_fp32"], two["fsdp_param"]) == []
    # The ranks' gradients were averaged: not rank 0's own, and the same average under DDP and FSDP2.
    assert len(differing(two["own"], two["fsdp_param"])) == len(two["own"])
    for name, g in two["ddp_param"].items():
        torch.testing.assert_close(g, two["fsdp_param"][name], rtol=1e-2, atol=1e-4)


def test_two_ranks_sum_to_fp32s_bits_in_bf16_and_four_do_not(tmp_path):
    assert_two_ranks_sum_to_fp32s_bits(reduced_gradients(2, tmp_path))
    four = reduced_gradients(4, tmp_path)
    assert differing(four["fsdp_fp32"], four["fsdp_param"]), "four bf16 gradients summed in bf16 rounded like fp32"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL's sums need two NVIDIA GPUs")
def test_nccl_on_two_gpus_sums_to_fp32s_bits_in_bf16(tmp_path):
    assert_two_ranks_sum_to_fp32s_bits(reduced_gradients(2, tmp_path, on_gpu=True))
