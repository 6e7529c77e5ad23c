"""The worker side of backend=nemo: write the data, compose the recipe, run it, summarise the run.

Training needs CUDA (Megatron's gradient buffers) and, for Llama's fused rope, Transformer Engine:
it runs in a NeMo container on GPU nodes. Everything before `fit` runs anywhere NeMo imports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from ghsweep.train import data as dolly
from ghsweep.train.flops import ModelShape, add_throughput_metrics, run_flops_per_token
from ghsweep.train.nemo.metrics import StepMetricsCallback
from ghsweep.train.nemo.recipe import DATASET_DIR, build_recipe, check_config, hf_import_path, save_recipe
from ghsweep.train.tokenizer import ByteTokenizer
from ghsweep.train.torch_backend import device_name, peak_memory_gib
from ghsweep.train.unified_memory import ManagedMemory

# Records held out as NeMo's validation file, which its data module requires (never evaluated:
# ghsweep runs no validation passes).
VALIDATION_RECORDS = 8


def write_dataset(cfg: DictConfig, root: Path) -> int:
    """The run's dolly records in NeMo's fine-tuning format, one {"input", "output"} per line."""
    records = dolly.load_records(cfg.data, cfg.seed, cfg.train.seq_length, _tokenizer(cfg))
    root.mkdir(parents=True, exist_ok=True)
    splits = {"training.jsonl": records[VALIDATION_RECORDS:], "validation.jsonl": records[:VALIDATION_RECORDS]}
    for name, split in splits.items():
        with open(root / name, "w", encoding="utf-8") as f:
            for r in split:
                # The same prompt as the torch backend's; NeMo masks it out of the loss as well.
                f.write(json.dumps({"input": dolly.prompt_text(r), "output": r["response"]}) + "\n")
    return len(splits["training.jsonl"])


def _tokenizer(cfg: DictConfig) -> dolly.Tokenizer:
    """The tokenizer NeMo trains with: the checkpoint's, else byte-level (as the recipe sets it)."""
    if not cfg.model.path:
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.path)


def import_hf_model(model_path: str) -> None:
    """Convert a Hugging Face folder into NeMo's model cache once (NeMo skips it when present)."""
    from nemo.collections import llm

    if not hf_import_path(model_path).exists():
        llm.import_ckpt(model=llm.LlamaModel(llm.Llama2Config7B()), source=f"hf://{model_path}")


def train(cfg: DictConfig, run_dir: Path, managed: ManagedMemory | None = None) -> dict:
    """Run the recipe `cfg` maps to; metrics.jsonl comes from StepMetricsCallback; return the summary."""
    import fiddle as fdl
    import nemo

    t_setup = time.time()
    check_config(cfg, runtime=True)
    if not torch.cuda.is_available():
        raise RuntimeError("backend=nemo: training needs an NVIDIA GPU (Megatron keeps its gradient buffers in CUDA)")
    if cfg.precision.name == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = bool(cfg.precision.allow_tf32)
    examples = write_dataset(cfg, run_dir / DATASET_DIR)
    if cfg.model.path:
        import_hf_model(cfg.model.path)
    recipe = build_recipe(cfg, run_dir)
    save_recipe(recipe, run_dir)
    finetune = fdl.build(recipe)
    metrics_cb = next(c for c in finetune.keywords["trainer"].callbacks if isinstance(c, StepMetricsCallback))
    finetune()

    log = metrics_cb.log
    device = torch.device("cuda", torch.cuda.current_device())
    metrics = log.summary(cfg.train.warmup_steps)
    managed_peak = managed.peak_gib() if managed else None
    metrics["peak_mem_gb"] = managed_peak if managed_peak is not None else peak_memory_gib(device)
    m = cfg.model
    shape = ModelShape(m.hidden_size, m.intermediate_size, m.num_layers, m.num_attention_heads,
                       m.num_key_value_heads, m.vocab_size)
    flops = run_flops_per_token(shape, cfg)
    name = device_name(device)
    gpus = cfg.backend.num_nodes * cfg.backend.gpus_per_node
    peak = add_throughput_metrics(metrics, flops, name, cfg.precision.name, gpus=gpus)
    # The same world metrics as the torch backend: the comparison's scaling column reads them.
    metrics["world_size"] = gpus
    metrics["tokens_per_s_per_gpu"] = metrics["tokens_per_s"] / gpus
    info = {
        "device": str(device),
        "device_name": name,
        "torch_version": torch.__version__,
        "nemo_version": nemo.__version__,
        "random_init": not cfg.model.path,
        "params_total": metrics_cb.params_total,
        "params_trainable": metrics_cb.params_trainable,
        "examples": examples,
        "flops_per_token": flops,
        "mfu_peak_tflops": peak,
        "offload_applied": bool(cfg.offload.enabled),
    }
    if managed:
        info["unified_allocator"] = managed.allocator
    return {
        "metrics": metrics,
        "timing": {"setup_s": metrics_cb.train_started_at - t_setup,
                   "train_s": metrics_cb.train_ended_at - metrics_cb.train_started_at},
        "info": info,
    }
