"""Training FLOPs per token and the peak they are measured against (MFU).

Counted the way MFU is usually reported: GEMM FLOPs of every linear layer (lm_head included,
embeddings excluded) and attention's two batched GEMMs without causal halving, over the keys each
token is masked to see: the whole block with causal masking, only its own example with document
masking (the blocks a document-masked kernel computes; attention.attended_keys_per_token). Backward costs
twice the forward for each trained weight (input gradient + weight gradient) but only once for a
frozen one: LoRA skips the frozen base's weight-gradient GEMMs, about a third of the work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ghsweep.config.schema import ConfigSchema, ModelSchema, carried

# Dense tensor-core peaks in TFLOP/s (datasheet, SXM parts), by device-name fragment.
PEAK_TFLOPS = {
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 66.9},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp32": 80.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "fp8": 733.0, "fp32": 91.6},
}


@dataclass(frozen=True)
class ModelShape:
    """What a decoder's FLOPs per token depend on, in the model config's names (conf/model)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> ModelShape:
        """The shape in a Hugging Face config (config.json, or `PretrainedConfig.to_dict()`); one
        without num_key_value_heads has a key/value head per attention head."""
        return cls(
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            vocab_size=hf["vocab_size"],
        )

    def hf_fields(self) -> dict[str, Any]:
        """The shape in a Hugging Face config's names: what from_hf reads."""
        return {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
        }

    @classmethod
    def of_model(cls, model: ModelSchema) -> ModelShape:
        """The shape a model config (conf/model/NAME.yaml) sets."""
        return cls(**{f.name: getattr(model, f.name) for f in fields(cls)})

    @classmethod
    def of_run(cls, model: ModelSchema) -> ModelShape:
        """The shape a run trains: its folder's config.json where model.path is set, else its config's."""
        if model.path is None:
            return cls.of_model(model)
        return cls.from_hf(json.loads((Path(model.path) / "config.json").read_text()))

    @property
    def layer_weights(self) -> int:
        """One decoder layer's linear weights: q and o, k and v (grouped), the MLP's three."""
        h = self.hidden_size
        kv = h * self.num_key_value_heads // self.num_attention_heads
        return h * h * 2 + h * kv * 2 + 3 * h * self.intermediate_size

    @property
    def parameters(self) -> int:
        """Every weight: the layers' linear weights and norms, the embedding, the final norm and an
        untied LM head (Llama's)."""
        h = self.hidden_size
        return self.num_layers * (self.layer_weights + 2 * h) + 2 * self.vocab_size * h + h


def flops_per_token(shape: ModelShape, attended_keys: float, lora_rank: int | None, lora_modules: int = 7) -> float:
    """Forward + backward FLOPs per token, each token attending to `attended_keys` keys (the
    sequence length for a causal block); `lora_rank` None means full fine-tuning."""
    h, layers = shape.hidden_size, shape.num_layers
    linear_fwd = 2 * (layers * shape.layer_weights + h * shape.vocab_size)
    attention_fwd = 2 * 2 * attended_keys * h * layers  # QK^T and PV
    if lora_rank is None:
        return 3 * (linear_fwd + attention_fwd)
    # Adapters: two thin GEMMs per targeted projection, trained (3x); roughly r*(in+out) each.
    adapter_fwd = 2 * layers * lora_modules * lora_rank * 2 * h
    return 2 * linear_fwd + 3 * attention_fwd + 3 * adapter_fwd


def run_flops_per_token(shape: ModelShape, config: ConfigSchema, attended_keys: float | None = None) -> float:
    """flops_per_token for a run: the keys each token attends to (default: the whole sequence),
    and LoRA's rank and targets when peft=lora."""
    keys = config.train.seq_length if attended_keys is None else attended_keys
    peft = config.peft
    if peft.name != "lora":
        return flops_per_token(shape, keys, None)
    return flops_per_token(
        shape, keys, carried(peft.r, "peft.r"), len(carried(peft.target_modules, "peft.target_modules"))
    )


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak for this device and precision, None when the device is not in the table."""
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in device_name:
            return peaks.get(precision)
    return None


def add_throughput_metrics(
    metrics: dict, flops: float, device_name: str, precision: str, gpus: int = 1
) -> float | None:
    """Add `tflops_per_gpu` (and `mfu` where the device's peak is known) to a run's metrics from
    its `tokens_per_s`; returns the peak used, recorded as the param `mfu_peak_tflops`."""
    metrics["tflops_per_gpu"] = flops * metrics["tokens_per_s"] / gpus / 1e12
    peak = peak_tflops(device_name, precision)
    if peak:
        metrics["mfu"] = metrics["tflops_per_gpu"] / peak
    return peak
