"""What AutoModel's recipe cannot do, told before any GPU time; no AutoModel or torch import."""

from __future__ import annotations

from omegaconf import DictConfig

from ghsweep.core.errors import ConfigError

# ghsweep's precision -> the one dtype AutoModel trains in (fp8: bf16 with torchao's float8 layers).
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError for what the AutoModel recipe cannot do, before any GPU time."""
    if cfg.precision.name not in TORCH_DTYPES:
        raise ConfigError(
            f"precision={cfg.precision.name}: AutoModel trains in one dtype without loss scaling; "
            "accepted with backend=automodel: fp32, bf16, fp8"
        )
    if cfg.precision.name == "fp8" and cfg.precision.library not in ("auto", "torchao"):
        raise ConfigError(
            f"precision.library={cfg.precision.library}: AutoModel's fp8 is torchao's float8 training; "
            "accepted with backend=automodel: auto, torchao"
        )
    if cfg.precision.name == "fp8" and cfg.precision.scaling != "current":
        raise ConfigError(
            f"precision.scaling={cfg.precision.scaling}: torchao's float8 training scales from the tensor itself; "
            "accepted with backend=automodel: current"
        )
    if cfg.train.optimizer not in ("auto", "adamw"):
        raise ConfigError(
            f"train.optimizer={cfg.train.optimizer}: AutoModel's recipe here steps torch's AdamW; "
            "accepted with backend=automodel: auto, adamw"
        )
    if cfg.offload.enabled:
        raise ConfigError(
            "offload=on: AutoModel offloads parameters and optimizer state (FSDP2's CPUOffloadPolicy), "
            "not activations; accepted with backend=automodel: off"
        )
