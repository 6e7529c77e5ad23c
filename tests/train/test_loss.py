"""train.loss_chunks: the loss made a block of logits at a time equals the whole-logits loss, and
so do the gradients of the hidden states and of the output weight."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from ghsweep.train import torch_backend
from ghsweep.train.data import IGNORE_INDEX
from ghsweep.train.loss import causal_lm_loss, chunked_causal_lm_loss
from tests.conftest import CONF_DIR


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_chunked_loss_and_gradients_equal_the_whole_logits_loss(dtype, tolerance):
    torch.manual_seed(0)
    hidden = torch.randn(2, 37, 64, dtype=dtype)
    weight = torch.randn(101, 64, dtype=dtype) * 0.3
    labels = torch.randint(0, 101, (2, 37))
    labels[:, :9] = IGNORE_INDEX  # a prompt: not counted
    results = []
    for loss_fn in (causal_lm_loss, lambda h, w, y: chunked_causal_lm_loss(h, w, y, chunks=3)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = loss_fn(h, w, labels)
        (loss * 2).backward()  # an upstream gradient other than 1 reaches both gradients
        results.append((loss, h.grad, w.grad))
    for ours, theirs in zip(results[1], results[0]):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tolerance, atol=tolerance)


def test_chunked_loss_with_a_frozen_output_weight_computes_no_weight_gradient():
    hidden = torch.randn(1, 16, 8, requires_grad=True)
    weight = torch.randn(11, 8)
    loss = chunked_causal_lm_loss(hidden, weight, torch.randint(0, 11, (1, 16)), chunks=4)
    loss.backward()
    assert weight.grad is None and hidden.grad.abs().sum() > 0


def test_training_loop_with_a_chunked_loss_follows_the_whole_loss(tmp_path):
    """The real training loop (tiny Llama, CPU, fp32): the same losses step by step."""
    curves = {}
    for chunks in (1, 4):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["device=cpu", "profile=none", "precision=fp32",
                                                           "train.max_steps=4", "train.seq_length=64",
                                                           f"train.loss_chunks={chunks}"])
        run_dir = tmp_path / str(chunks)
        run_dir.mkdir()
        torch_backend.train(cfg, run_dir)
        curves[chunks] = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert curves[4] == pytest.approx(curves[1], rel=1e-4)
    assert curves[4][-1] < curves[4][0]
