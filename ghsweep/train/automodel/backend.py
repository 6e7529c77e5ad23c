"""The worker side of backend=automodel: write the recipe config, run AutoModel's recipe, summarise.

AutoModel's own recipe runs the loop (FSDP2, LoRA, torchao fp8, compile); a subclass only wraps each
optimizer step in the torch backend's measurements: the "step N" NVTX range and the capture window
(Phases), and the metrics.jsonl row (StepLog).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from ghsweep.train.attention import attended_keys_per_token
from ghsweep.train.automodel.config import check_config, recipe_config, write_recipe
from ghsweep.train.flops import ModelShape, add_throughput_metrics, run_flops_per_token
from ghsweep.train.phases import Phases
from ghsweep.train.step_log import StepLog
from ghsweep.train.tokenizer import load_tokenizer
from ghsweep.train.torch_backend import device_name, load_blocks
from ghsweep.train.unified_memory import ManagedMemory


def _single_process_env() -> None:
    """torch.distributed's environment for one process, unless a launcher (torchrun, SLURM) set it."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def _measured_recipe(cfg: DictConfig, run_dir: Path, tokens_per_step: int) -> Any:
    from nemo_automodel.recipes.llm.train_ft import TrainFinetuneRecipeForNextTokenPrediction

    class MeasuredRecipe(TrainFinetuneRecipeForNextTokenPrediction):
        steps_done = 0
        # AutoModel resets the peak-memory counter after every logged step; the run's peak is the
        # largest per-step peak it reports.
        peak_gib = 0.0

        def setup(self) -> None:
            # On one GPU AutoModel builds a Hugging Face model on the CPU and initialises it there (minutes
            # at 7B); built under the CUDA device it is initialised where it trains.
            with torch.device("cuda", torch.cuda.current_device()):
                super().setup()

        def run_train_validation_loop(self) -> None:
            device = torch.device("cuda", torch.cuda.current_device())
            self.step_log = StepLog(run_dir / "metrics.jsonl", device, tokens_per_step)
            self.phases = Phases(device, cfg.capture.start_step, cfg.capture.num_steps)
            self.train_started_at = time.time()
            super().run_train_validation_loop()
            self.phases.close()
            self.step_log.close()
            self.train_ended_at = time.time()

        def _run_train_optim_step(self, batches, max_grad_norm=None):
            step = self.steps_done
            with self.phases.step(step):
                started = self.step_log.start()
                sample = super()._run_train_optim_step(batches, max_grad_norm)
                self.step_log.end(step, torch.tensor(sample.metrics["loss"]), started)
            self.steps_done += 1
            self.peak_gib = max(self.peak_gib, sample.metrics["mem"])
            if self.steps_done % cfg.train.log_every == 0 or self.steps_done == cfg.train.max_steps:
                self.step_log.flush()
                print(f"step {self.steps_done}/{cfg.train.max_steps} loss {self.step_log.losses[-1]:.4f} "
                      f"step_time_ms {self.step_log.step_times_ms[-1]:.1f}", flush=True)
            return sample

    return MeasuredRecipe


def train(cfg: DictConfig, run_dir: Path, managed: ManagedMemory | None = None) -> dict:
    """Run the AutoModel recipe `cfg` maps to; metrics.jsonl as the torch backend's; return the summary."""
    import nemo_automodel
    from nemo_automodel.components.config.loader import load_yaml_config

    t_setup = time.time()
    check_config(cfg)
    if not torch.cuda.is_available():
        raise RuntimeError("backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL)")
    _single_process_env()
    recipe_cfg = recipe_config(cfg, run_dir, "cuda")
    recipe_path = write_recipe(recipe_cfg, run_dir)
    tokens_per_step = cfg.train.micro_batch_size * cfg.train.seq_length
    recipe = _measured_recipe(cfg, run_dir, tokens_per_step)(load_yaml_config(str(recipe_path)))
    recipe.setup()
    model = recipe.model_parts[0]
    params_total = sum(p.numel() for p in model.parameters())
    params_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    recipe.run_train_validation_loop()

    device = torch.device("cuda", torch.cuda.current_device())
    metrics = recipe.step_log.summary(cfg.train.warmup_steps)
    managed_peak = managed.peak_gib() if managed else None
    metrics["peak_mem_gb"] = managed_peak if managed_peak is not None else recipe.peak_gib
    hf = model.config
    shape = ModelShape(hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
                       hf.num_key_value_heads, hf.vocab_size)
    # The blocks the recipe's dataset packed (packed_dolly), for the attention FLOPs of document masking.
    blocks = load_blocks(cfg, load_tokenizer(cfg.model))
    flops = run_flops_per_token(shape, cfg, attended_keys_per_token(blocks.position_ids,
                                                                    cfg.data.packing_mask == "document"))
    name = device_name(device)
    peak = add_throughput_metrics(metrics, flops, name, cfg.precision.name)
    info = {
        "device": str(device),
        "device_name": name,
        "torch_version": torch.__version__,
        "automodel_version": nemo_automodel.__version__,
        "random_init": not cfg.model.path,
        "params_total": params_total,
        "params_trainable": params_trainable,
        "packed_blocks": len(blocks),
        "examples_dropped_too_long": blocks.dropped,
        "dataloader_workers": cfg.dataloader.num_workers,
        "compiled": recipe_cfg["compile"]["enabled"],
        "attention": recipe_cfg["model"]["attn_implementation"],
        "flops_per_token": flops,
        "mfu_peak_tflops": peak,
        "offload_applied": False,
    }
    if cfg.precision.name == "fp8":
        info["fp8_library"] = "torchao"
    if managed:
        info["unified_allocator"] = managed.allocator
    return {
        "metrics": metrics,
        "timing": {"setup_s": recipe.train_started_at - t_setup,
                   "train_s": recipe.train_ended_at - recipe.train_started_at},
        "info": info,
    }
