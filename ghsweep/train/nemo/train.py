"""The worker side of backend=nemo: write the data, compose the recipe, run it, summarise the run.

Training needs CUDA (Megatron's gradient buffers). With Transformer Engine (the NeMo container) it
uses NeMo's own layer spec; without it, Megatron's local spec with PyTorch attention
(`compat`). Everything before `fit` runs anywhere NeMo imports.
Nothing here loads transformers or peft (the torch backend's model): the pieces both backends use
live in light modules (data, device, flops, summary).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from ghsweep.config.backends import ManagedAllocator
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.summary import RunSummary
from ghsweep.train import data as dolly
from ghsweep.train.attention import attended_keys_per_token
from ghsweep.train.device import peak_memory_gib
from ghsweep.train.flops import run_flops_per_token
from ghsweep.train.nemo.compat import allow_lora_without_te, track_nemo_auto_tokenizer
from ghsweep.train.nemo.metrics import StepMetricsCallback
from ghsweep.train.nemo.recipe import (
    DATASET_DIR,
    build_recipe,
    hf_import_path,
    llama_folder_importer,
    model_shape,
    save_recipe,
    transformer_engine_available,
)
from ghsweep.train.summary import run_peak_gib, run_summary
from ghsweep.train.tokenizer import load_tokenizer

# Records held out as NeMo's validation file, which its data module requires (never evaluated:
# ghsweep runs no validation passes).
VALIDATION_RECORDS = 8


def write_dataset(cfg: DictConfig, root: Path) -> int:
    """The run's dolly records in NeMo's fine-tuning format, one {"input", "output"} per line."""
    records = dolly.load_records(cfg.data, cfg.seed, cfg.train.seq_length, load_tokenizer(cfg.model))
    root.mkdir(parents=True, exist_ok=True)
    splits = {"training.jsonl": records[VALIDATION_RECORDS:], "validation.jsonl": records[:VALIDATION_RECORDS]}
    for name, split in splits.items():
        with open(root / name, "w", encoding="utf-8") as f:
            for r in split:
                # The same prompt as the torch backend's; NeMo masks it out of the loss as well.
                f.write(json.dumps({"input": dolly.prompt_text(r), "output": r["response"]}) + "\n")
    return len(splits["training.jsonl"])


def import_hf_model(model: DictConfig, recipe: Any) -> None:
    """Convert the Hugging Face folder `model.path` into NeMo's model cache once (skipped when it
    is there), into the model `recipe` trains."""
    import fiddle as fdl

    target = hf_import_path(model.path)
    if not target.exists():
        llama_folder_importer(str(model.path), fdl.build(recipe.model.config))(output_path=target)


def train(cfg: DictConfig, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None) -> RunSummary:
    """Run the recipe `cfg` maps to; metrics.jsonl comes from StepMetricsCallback; return the summary."""
    import fiddle as fdl
    import nemo

    setup_at = time.time()
    if not torch.cuda.is_available():
        raise RuntimeError("backend=nemo: training needs an NVIDIA GPU (Megatron keeps its gradient buffers in CUDA)")
    if cfg.precision.name == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = bool(cfg.precision.allow_tf32)
    examples = write_dataset(cfg, run_dir / DATASET_DIR)
    if cfg.peft.name == "lora" and not transformer_engine_available():
        allow_lora_without_te()
    if cfg.model.path:
        track_nemo_auto_tokenizer()
    recipe = build_recipe(cfg, run_dir)
    save_recipe(recipe, run_dir)
    if cfg.model.path:
        import_hf_model(cfg.model, recipe)
    finetune = fdl.build(recipe)
    metrics_cb = next(c for c in finetune.keywords["trainer"].callbacks if isinstance(c, StepMetricsCallback))
    finetune()

    device = torch.device("cuda", torch.cuda.current_device())
    # Attention FLOPs over the documents each token sees, counted on the torch backend's packing of
    # the same records (NeMo packs them differently, but every token still sees only its own document).
    blocks = dolly.load_blocks(cfg, load_tokenizer(cfg.model))
    flops = run_flops_per_token(model_shape(cfg.model), cfg, attended_keys_per_token(blocks.position_ids, True))
    if metrics_cb.log is None:
        raise RuntimeError("NeMo's trainer returned without starting training: no step was measured")
    return run_summary(
        cfg,
        metrics_cb.log,
        device,
        peak_gib=run_peak_gib(managed, lambda: peak_memory_gib(device)),
        flops_per_token=flops,
        gpus=plan.world.size,
        params=(metrics_cb.params_total, metrics_cb.params_trainable),
        random_init=not cfg.model.path,
        offload_applied=bool(cfg.offload.enabled),
        profiled=plan.profile.used != "none",
        managed=managed,
        setup_at=setup_at,
        train_started_at=metrics_cb.train_started_at,
        train_ended_at=metrics_cb.train_ended_at,
        info={"nemo_version": nemo.__version__, "examples": examples},
    )
