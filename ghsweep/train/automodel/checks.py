"""What AutoModel's recipe cannot do, told before any GPU time; no AutoModel or torch import."""

from __future__ import annotations

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.errors import ConfigError

# ghsweep's precision -> the one dtype AutoModel trains in (fp8: bf16 with torchao's float8 layers).
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}


def check_config(config: ConfigSchema) -> None:
    """Raise ConfigError for what the AutoModel recipe cannot do, before any GPU time."""
    if config.precision.name not in TORCH_DTYPES:
        raise ConfigError(
            f"precision={config.precision.name}: AutoModel trains in one dtype without loss scaling; "
            "accepted with backend=automodel: fp32, bf16, fp8"
        )
    if config.precision.name == "fp8" and config.precision.library not in ("auto", "torchao"):
        raise ConfigError(
            f"precision.library={config.precision.library}: AutoModel's fp8 is torchao's float8 training; "
            "accepted with backend=automodel: auto, torchao"
        )
    if config.precision.name == "fp8" and config.precision.scaling != "current":
        raise ConfigError(
            f"precision.scaling={config.precision.scaling}: torchao's float8 training scales from the tensor itself; "
            "accepted with backend=automodel: current"
        )
    if config.train.optimizer not in ("auto", "adamw"):
        raise ConfigError(
            f"train.optimizer={config.train.optimizer}: AutoModel's recipe here steps torch's AdamW; "
            "accepted with backend=automodel: auto, adamw"
        )
    if config.offload.enabled:
        raise ConfigError(
            "offload=on: AutoModel offloads parameters and optimizer state (FSDP2's CPUOffloadPolicy), "
            "not activations; accepted with backend=automodel: off"
        )
