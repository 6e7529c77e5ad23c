"""The usual fine-tuning stack, as people write it: transformers Llama (SDPA attention) + peft
LoRA, fused AdamW, the model's own loss over the labels; optionally each decoder layer
torch.compile'd, torchao float8 on every Linear but lm_head, and document masking of packed
examples the usual way (position ids passed to the model, from which transformers builds the mask)."""

from __future__ import annotations

import dataclasses

import torch
from transformers import LlamaForCausalLM

from ghsweep.config.schema import PeftSchema
from ghsweep.train.dolly_data import PackedBlocks
from ghsweep.train.flops import ModelShape
from ghsweep.train.model import llama_config, lora_config


def train_steps(
    shape: ModelShape,
    blocks: PackedBlocks,
    steps: int,
    peft: str,
    compile_layers: bool,
    float8: bool,
    lora: PeftSchema | None,
    document: bool,
) -> tuple[list[float], float]:
    """Step times in ms and peak allocated GiB over micro-batches of one packed block.
    peft: 'defaults', 'bf16_adapters' or 'none'; `lora` the rank, alpha and targets."""
    seq_length = blocks.input_ids.shape[1]
    config = llama_config(shape, max(seq_length, 4096), "sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        base = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model: torch.nn.Module = base
    if peft != "none":
        from peft import get_peft_model

        if lora is None:
            raise ValueError(f"peft={peft}: LoRA adapters need `lora` (rank, alpha and targets)")
        # Without dropout: the usual stack's benchmark measures the step, not regularisation.
        adapters = lora_config(dataclasses.replace(lora, dropout=0.0))
        model = get_peft_model(model, adapters, autocast_adapter_dtype=peft == "defaults")
    if float8:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: "lm_head" not in fqn)
    if compile_layers:
        # LoRA wraps the model in place: `base` is the PEFT model's base model.
        for layer in base.model.layers:
            layer.compile()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    times = []
    for step in range(steps):
        i = step % len(blocks)
        ids, labels = blocks.input_ids[i : i + 1].cuda(), blocks.labels[i : i + 1].cuda()
        positions = {"position_ids": blocks.position_ids[i : i + 1].cuda()} if document else {}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = model(input_ids=ids, labels=labels, use_cache=False, **positions).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times, torch.cuda.max_memory_allocated() / 2**30
