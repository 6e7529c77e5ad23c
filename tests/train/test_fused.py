"""train.fuse_projections: one GEMM for q/k/v and one for gate/up computes what the separate
projections compute, gradients of the LoRA matrices included, and the training loop uses it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ghsweep.train import torch_backend
from ghsweep.train.fused import FusedLlamaAttention, FusedLlamaMLP, fuse_enabled, fuse_projections
from ghsweep.train.model import apply_peft, build_model
from tests.conftest import CONF_DIR


def lora_decoder(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model, _, _ = build_model(OmegaConf.load(CONF_DIR / "model" / "tiny_llama.yaml"), torch.device("cpu"),
                              torch.float32)
    peft_cfg = OmegaConf.merge(OmegaConf.load(CONF_DIR / "peft" / "lora.yaml"), {"dropout": dropout})
    model = apply_peft(model, peft_cfg, torch.float32)
    for name, param in model.named_parameters():  # non-zero B matrices: the adapters take part
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model.get_base_model().model


def test_fused_layer_matches_the_separate_projections_and_their_gradients():
    separate = lora_decoder()
    fused = copy.deepcopy(separate)
    assert fuse_projections(fused.layers) == 2 * len(fused.layers)
    assert type(fused.layers[0].self_attn) is FusedLlamaAttention and type(fused.layers[0].mlp) is FusedLlamaMLP
    assert sum(p.numel() for p in fused.parameters() if p.requires_grad) == sum(
        p.numel() for p in separate.parameters() if p.requires_grad)
    ids = torch.randint(0, 320, (2, 64))
    outputs = []
    for decoder in (separate, fused):
        out = decoder(input_ids=ids, use_cache=False)[0]
        out.square().mean().backward()
        outputs.append(out)
    torch.testing.assert_close(outputs[1], outputs[0])
    for index, (plain, joined) in enumerate(zip(separate.layers, fused.layers)):
        attn, mlp = plain.self_attn, plain.mlp
        expected = {
            "qkv_proj.lora_A": torch.cat([attn.q_proj.lora_A["default"].weight.grad, attn.k_proj.lora_A["default"].weight.grad,
                                          attn.v_proj.lora_A["default"].weight.grad]),
            "qkv_proj.lora_B.2": attn.v_proj.lora_B["default"].weight.grad,
            "gate_up_proj.lora_A": torch.cat([mlp.gate_proj.lora_A["default"].weight.grad,
                                              mlp.up_proj.lora_A["default"].weight.grad]),
            "gate_up_proj.lora_B.0": mlp.gate_proj.lora_B["default"].weight.grad,
        }
        for name, grad in expected.items():
            module = (joined.self_attn if name.startswith("qkv") else joined.mlp).get_submodule(name)
            torch.testing.assert_close(module.weight.grad, grad, msg=f"layer {index} {name}")
        assert joined.self_attn.qkv_proj.base.weight.grad is None  # the frozen base computes no weight gradient


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["device=cpu", "profile=none", "precision=fp32",
                                                        "train.max_steps=4", "train.seq_length=64", *overrides])


@pytest.mark.parametrize("overrides, fused", [
    ((), True), (("peft.dropout=0.1",), False), (("peft=none",), True), (("train.fuse_projections=false",), False)])
def test_fused_unless_lora_dropout_draws_a_mask_per_projection(overrides, fused):
    cfg = composed(*overrides)
    assert fuse_enabled(cfg.train, cfg.peft) is fused


@pytest.mark.parametrize("peft", ["lora", "none"])
def test_training_loop_fuses_and_follows_the_unfused_losses(tmp_path, peft):
    curves = {}
    for fuse in (True, False):
        run_dir = tmp_path / str(fuse)
        run_dir.mkdir()
        summary = torch_backend.train(composed(f"peft={peft}", f"train.fuse_projections={fuse}"), Path(run_dir))
        assert summary["info"]["fused_projection_groups"] == (8 if fuse else 0)
        curves[fuse] = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert curves[True] == pytest.approx(curves[False], rel=1e-4)
    assert curves[True][-1] < curves[True][0]
