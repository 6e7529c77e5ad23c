"""precision=fp8: fp8 GEMMs in the decoder's large linear layers.

Transformer Engine when it is importable (NeMo containers ship it): its te.Linear layers under
te.fp8_autocast with a delayed- or current-scaling recipe; format hybrid = E4M3 forward, E5M2
backward. Otherwise fp8_cached's layers, torchao's tensorwise recipe with the weights cast outside
the GEMMs: once for frozen weights (a LoRA base model), once a step for trained ones. Weights that
FSDP2 shards (DTensors) are cast by torchao's float8 training in every forward instead.
lm_head and the LoRA adapters stay in bf16: fp8 pays off only on large GEMMs.
"""

from __future__ import annotations

import importlib.util

from torch import nn

from ghsweep.config.schema import PrecisionSchema, carried
from ghsweep.train.precision import Precision


def fp8_library(requested: str) -> str:
    has_te = importlib.util.find_spec("transformer_engine") is not None
    if requested == "te" and not has_te:
        raise ValueError("precision.library=te: transformer_engine is not installed; accepted here: auto, torchao")
    if requested in ("te", "auto") and has_te:
        return "te"
    if importlib.util.find_spec("torchao") is None:
        raise ValueError("precision=fp8: neither transformer_engine nor torchao is installed; pip install torchao")
    return "torchao"


def _is_fp8_target(name: str, module: nn.Module) -> bool:
    if not isinstance(module, nn.Linear) or "lm_head" in name or "lora_" in name:
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_fp8(
    model: nn.Module,
    precision_config: PrecisionSchema,
    precision: Precision,
    fsdp_sharded: bool = False,
    fsdp_all_gather: bool = False,
) -> str:
    """Swap the target linear layers for fp8 ones; returns the library used. `fsdp_sharded`: FSDP2
    will shard the trained weights; `fsdp_all_gather`: torchao then casts them to fp8 before FSDP2
    gathers them (half the bytes of bf16)."""
    library = fp8_library(carried(precision_config.library, "precision.library"))
    if library == "torchao":
        if precision_config.scaling != "current":
            raise ValueError(
                f"precision.scaling={precision_config.scaling}: torchao float8 scales from the current "
                "tensor only; accepted with torchao: current"
            )
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        from ghsweep.train.fp8_cached import freeze_to_fp8, train_in_fp8

        freeze_to_fp8(model, _is_fp8_target)
        if not fsdp_sharded:
            train_in_fp8(model, _is_fp8_target)
            return library
        convert_to_float8_training(
            model,
            config=Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather),
            module_filter_fn=lambda m, fqn: _is_fp8_target(fqn, m),
        )
        return library

    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    fmt = recipe.Format.HYBRID if precision_config.format == "hybrid" else recipe.Format.E4M3
    fp8_recipe = (
        recipe.DelayedScaling(fp8_format=fmt)
        if precision_config.scaling == "delayed"
        else recipe.Float8CurrentScaling(fp8_format=fmt)
    )
    for name, module in list(model.named_modules()):
        if _is_fp8_target(name, module):
            parent_name, _, child = name.rpartition(".")
            replacement = te.Linear(
                module.in_features,
                module.out_features,
                bias=module.bias is not None,
                params_dtype=module.weight.dtype,
                device=module.weight.device,
            )
            replacement.load_state_dict(module.state_dict())
            replacement.weight.requires_grad_(module.weight.requires_grad)
            setattr(model.get_submodule(parent_name), child, replacement)
    precision.fp8_region = lambda: te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)
    return library
