"""The config groups mapped onto the config of NeMo AutoModel's `TrainFinetuneRecipeForNextTokenPrediction`.

Everything here is plain data: no AutoModel import, so the dry run prints a backend=automodel run's
recipe config on any machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ghsweep.config.schema import ConfigSchema, TrainSchema, carried
from ghsweep.core.run_dir import AUTOMODEL_RECIPE
from ghsweep.train.automodel.checks import TORCH_DTYPES
from ghsweep.train.flops import ModelShape
from ghsweep.train.packed_attention import resolve
from ghsweep.train.schedule import warmup_steps
from ghsweep.train.tokenizer import ByteTokenizer

# The recipe config a run trained with, as AutoModel's own YAML (its CLI takes the same file).


def attn_implementation(config: ConfigSchema, device_type: str) -> str:
    """transformers' attention for the model: the torch backend's choice for the same packing mask."""
    chosen = resolve(config.train.attention, config.data.packing_mask, device_type)
    return "flex_attention" if chosen == "flex" else "sdpa"


def _model(config: ConfigSchema, device_type: str) -> dict[str, Any]:
    m = config.model
    common = {
        "torch_dtype": TORCH_DTYPES[config.precision.name],
        "attn_implementation": attn_implementation(config, device_type),
        # The torch backend's model as it is: no Liger kernels swapped in.
        "use_liger_kernel": False,
    }
    if m.path:
        return {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(m.path),
            **common,
        }
    llama = {
        "_target_": "transformers.LlamaConfig",
        **ModelShape.of_model(m).hf_fields(),
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.rms_norm_eps,
        "bos_token_id": ByteTokenizer.bos_token_id,
        "eos_token_id": ByteTokenizer.eos_token_id,
        "pad_token_id": ByteTokenizer.pad_token_id,
        "use_cache": False,
    }
    return {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config", "config": llama, **common}


def lr_scheduler(train: TrainSchema) -> dict[str, Any]:
    """The torch backend's schedule (schedule.lr_factor) in AutoModel's scheduler (Megatron's
    OptimizerParamScheduler); without it AutoModel keeps the rate constant.

    Step k (from 0) trains at init_lr + (max_lr - init_lr) * k / lr_warmup_steps up to the end of
    warm-up: with one warm-up step fewer and init_lr = lr / warmup that is the torch backend's
    lr * (k + 1) / warmup. The decay then ends at min_lr on the last step as the torch backend's
    does, its midpoint within a step of it.
    """
    warmup = warmup_steps(train.max_steps, train.lr_warmup_ratio)
    return {
        "lr_warmup_steps": max(0, warmup - 1),
        "lr_decay_steps": train.max_steps - 1,
        "lr_decay_style": train.lr_schedule,
        "init_lr": train.lr / max(1, warmup),
        "max_lr": train.lr,
        "min_lr": train.lr * train.min_lr_ratio,
    }


def recipe_config(config: ConfigSchema, run_dir: Path, device_type: str) -> dict[str, Any]:
    """The AutoModel recipe config that trains `config`, logging into `run_dir`."""
    t = config.train
    dl = config.dataloader
    # Never reached: ghsweep measures training steps, without validation passes or checkpoints.
    never = t.max_steps + 1
    recipe: dict[str, Any] = {
        "seed": config.seed,
        "step_scheduler": {
            "global_batch_size": t.micro_batch_size,
            "local_batch_size": t.micro_batch_size,
            "max_steps": t.max_steps,
            "ckpt_every_steps": never,
            "val_every_steps": never,
            "num_epochs": t.max_steps,
            # AutoModel's own collection: automatic collection off, the young generations every N steps.
            **({"gc_every_steps": t.gc_interval} if t.gc_interval is not None else {}),
        },
        "dist_env": {"backend": "nccl", "timeout_minutes": 10},
        "model": _model(config, device_type),
        "checkpoint": {"enabled": False, "checkpoint_dir": str(run_dir / "automodel")},
        "distributed": {"strategy": "fsdp2", "dp_size": None, "tp_size": 1, "cp_size": 1, "sequence_parallel": False},
        "loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"},
        # The torch backend's packed blocks, read back from this run's config.
        "dataset": {"_target_": "ghsweep.train.automodel.packed_dataset.packed_dolly", "run_dir": str(run_dir)},
        "dataloader": {
            "_target_": "torchdata.stateful_dataloader.StatefulDataLoader",
            "batch_size": t.micro_batch_size,
            "shuffle": True,
            "drop_last": True,
            "num_workers": dl.num_workers,
            "pin_memory": dl.pin_memory,
            "persistent_workers": dl.persistent_workers and dl.num_workers > 0,
            "collate_fn": "torch.utils.data.default_collate",
        },
        "optimizer": {
            "_target_": "torch.optim.AdamW",
            "lr": t.lr,
            "weight_decay": t.weight_decay,
            "betas": [0.9, 0.999],
            "eps": 1.0e-8,
        },
        "lr_scheduler": lr_scheduler(t),
        "compile": {"enabled": t.compiles(device_type == "cuda")},
    }
    if dl.num_workers > 0 and dl.prefetch_factor is not None:
        recipe["dataloader"]["prefetch_factor"] = dl.prefetch_factor
    if t.grad_clip is not None:
        recipe["clip_grad_norm"] = {"max_norm": t.grad_clip}
    if config.peft.name == "lora":
        p = config.peft
        recipe["peft"] = {
            "_target_": "nemo_automodel.components._peft.lora.PeftConfig",
            # AutoModel matches patterns against a module's full name.
            "target_modules": [f"*.{name}" for name in carried(p.target_modules, "peft.target_modules")],
            "dim": p.r,
            "alpha": p.alpha,
            "dropout": p.dropout,
        }
    if config.precision.name == "fp8":
        recipe["fp8"] = {"enabled": True, "recipe_name": "tensorwise", "filter_fqns": ["lm_head"], "emulate": False}
    return recipe


def write_recipe(recipe: dict[str, Any], run_dir: Path) -> Path:
    path = run_dir / AUTOMODEL_RECIPE
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
