"""How parallelize divides a model into FSDP2 units: each decoder layer, the LM head on its own, and the
root (embedding and final norm) - the head in the root where it is tied to the embedding. Real gloo ranks
on CPU, a small Llama, ghsweep's own parallelize."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.compose import compose_typed
from tests.support.gloo_ranks import on_ranks
from tests.support.models import TINY_LLAMA

TOKENS = 64


def _units_and_loss(ranks, device: torch.device, tied: bool, out: Path) -> None:
    """One rank: parallelize a tiny Llama with FSDP2, note which modules are units, train one step on this
    rank's batch, and (rank 0) save the units, the loss and the LM head's reduced gradient against the
    same model's loss unsharded."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import LlamaConfig, LlamaForCausalLM

    from ghsweep.train import distributed
    from ghsweep.train.loss import causal_lm_loss

    def model() -> LlamaForCausalLM:
        torch.manual_seed(0)
        shape = LlamaConfig(**TINY_LLAMA, vocab_size=256, tie_word_embeddings=tied)
        return LlamaForCausalLM(shape).to(device, torch.float32)

    batch = torch.randint(0, 256, (1, TOKENS), generator=torch.Generator().manual_seed(100 + ranks.rank))
    alone = model()
    alone_loss = distributed.TrainStep(alone.model, alone.lm_head, causal_lm_loss)(batch, batch)
    llama = model()
    step = distributed.TrainStep(llama.model, llama.lm_head, causal_lm_loss)
    parallel, mode, _ = distributed.parallelize(step, compose_typed("peft=none"), ranks, "fsdp")
    loss = parallel(batch, batch)
    loss.backward()
    head_grad = llama.lm_head.weight.grad.full_tensor()
    if ranks.is_main:
        units = {
            "layers": all(isinstance(layer, FSDPModule) for layer in llama.model.layers),
            "head": isinstance(step.head, FSDPModule),
            "root": isinstance(step, FSDPModule),
        }
        torch.save(
            {
                "mode": mode,
                "units": units,
                "loss": loss.item(),
                "alone_loss": alone_loss.item(),
                "head_grad_finite": bool(head_grad.isfinite().all()),
            },
            out,
        )


@pytest.mark.parametrize("tied", [False, True], ids=["head_apart", "head_tied_to_embedding"])
def test_fsdp2_shards_the_lm_head_as_its_own_unit_unless_tied(tied, tmp_path):
    out = tmp_path / "units.pt"
    on_ranks(_units_and_loss, 2, tied, out)
    seen = torch.load(out)
    assert seen["mode"] == "fsdp"
    assert seen["units"] == {"layers": True, "head": not tied, "root": True}
    # Sharding changes where the weights live, not what rank 0's batch costs.
    assert seen["loss"] == pytest.approx(seen["alone_loss"], rel=1e-5)
    assert seen["head_grad_finite"]
