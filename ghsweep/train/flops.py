"""Training FLOPs per token and the peak they are measured against (MFU).

Counted the way MFU is usually reported: GEMM FLOPs of every linear layer (lm_head included,
embeddings excluded) and attention's two batched GEMMs without causal halving, over the keys each
token is masked to see: the whole block with causal masking, only its own example with document
masking (the blocks a document-masked kernel computes; attention.attended_keys_per_token). Backward costs
twice the forward for each trained weight (input gradient + weight gradient) but only once for a
frozen one: LoRA skips the frozen base's weight-gradient GEMMs, about a third of the work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
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


def flops_per_token(shape: ModelShape, attended_keys: float, lora_rank: int | None, lora_modules: int = 7) -> float:
    """Forward + backward FLOPs per token, each token attending to `attended_keys` keys (the
    sequence length for a causal block); `lora_rank` None means full fine-tuning."""
    h, layers = shape.hidden_size, shape.num_layers
    kv = h * shape.num_key_value_heads // shape.num_attention_heads
    per_layer_weights = h * h * 2 + h * kv * 2 + 3 * h * shape.intermediate_size  # q,o + k,v + MLP
    linear_fwd = 2 * (layers * per_layer_weights + h * shape.vocab_size)
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
