"""The worker side of backend=nemo: write the data, compose the recipe, run it, summarise the run.

Training needs CUDA (Megatron's gradient buffers). With Transformer Engine (the NeMo container) it
uses NeMo's own layer spec; without it, Megatron's local spec with PyTorch attention
(`compat`). Everything before `fit` runs anywhere NeMo imports.
Nothing here loads transformers or peft (the torch backend's model): the pieces both backends use
live in light modules (dolly_data, device, flops, summary_builder).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from ghsweep.config.schema import ConfigSchema, ModelSchema
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train import dolly_data as dolly
from ghsweep.train.backend_protocol import ManagedAllocator
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
from ghsweep.train.packed_attention import attended_keys_per_token
from ghsweep.train.summary_builder import capture_window, run_peak_gib, run_summary
from ghsweep.train.tokenizer import load_tokenizer

# Records held out as NeMo's validation file, which its data module requires (never evaluated:
# ghsweep runs no validation passes).
VALIDATION_RECORDS = 8


def write_dataset(config: ConfigSchema, root: Path) -> int:
    """The run's dolly records in NeMo's fine-tuning format, one {"input", "output"} per line."""
    records = dolly.load_records(config.data, config.seed, config.train.seq_length, load_tokenizer(config))
    root.mkdir(parents=True, exist_ok=True)
    splits = {"training.jsonl": records[VALIDATION_RECORDS:], "validation.jsonl": records[:VALIDATION_RECORDS]}
    for name, split in splits.items():
        with open(root / name, "w", encoding="utf-8") as f:
            for r in split:
                # The same prompt as the torch backend's; NeMo masks it out of the loss as well.
                f.write(json.dumps({"input": dolly.prompt_text(r), "output": r["response"]}) + "\n")
    return len(splits["training.jsonl"])


def import_hf_model(model: ModelSchema, recipe: Any) -> None:
    """Convert the Hugging Face folder `model.path` into NeMo's model cache once (skipped when it
    is there), into the model `recipe` trains; nothing for a model built from its config."""
    if not model.path:
        return
    import fiddle as fdl

    target = hf_import_path(model.path)
    if not target.exists():
        llama_folder_importer(model.path, fdl.build(recipe.model.config))(output_path=target)


def train(config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None) -> RunSummary:
    """Run the recipe `config` maps to; metrics.jsonl comes from StepMetricsCallback; return the summary."""
    import fiddle as fdl
    import nemo

    setup_at = time.time()
    if not torch.cuda.is_available():
        raise RuntimeError("backend=nemo: training needs an NVIDIA GPU (Megatron keeps its gradient buffers in CUDA)")
    if config.precision.name == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = bool(config.precision.allow_tf32)
    examples = write_dataset(config, run_dir / DATASET_DIR)
    if config.peft.name == "lora" and not transformer_engine_available():
        allow_lora_without_te()
    if config.model.path:
        track_nemo_auto_tokenizer()
    recipe = build_recipe(config, run_dir)
    save_recipe(recipe, run_dir)
    import_hf_model(config.model, recipe)
    finetune = fdl.build(recipe)
    metrics_cb = next(c for c in finetune.keywords["trainer"].callbacks if isinstance(c, StepMetricsCallback))
    finetune()

    device = torch.device("cuda", torch.cuda.current_device())
    # Attention FLOPs over the documents each token sees, counted on the torch backend's packing of
    # the same records (NeMo packs them differently, but every token still sees only its own document).
    blocks = dolly.load_blocks(config, load_tokenizer(config))
    flops = run_flops_per_token(model_shape(config.model), config, attended_keys_per_token(blocks.position_ids, True))
    if metrics_cb.log is None:
        raise RuntimeError("NeMo's trainer returned without starting training: no step was measured")
    return run_summary(
        config,
        metrics_cb.log,
        device,
        peak_gib=run_peak_gib(managed, lambda: peak_memory_gib(device)),
        flops_per_token=flops,
        gpus=plan.world.size,
        params=(metrics_cb.params_total, metrics_cb.params_trainable),
        random_init=not config.model.path,
        offload_applied=config.offload.enabled,
        captured=capture_window(config, plan.profile.used != "none"),
        managed=managed,
        setup_at=setup_at,
        train_started_at=metrics_cb.train_started_at,
        train_ended_at=metrics_cb.train_ended_at,
        info={"nemo_version": nemo.__version__, "examples": examples},
    )
