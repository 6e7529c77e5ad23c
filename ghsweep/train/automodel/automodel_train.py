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

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.run_dir import METRICS
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train import dolly_data as dolly
from ghsweep.train.automodel.config import recipe_config, write_recipe
from ghsweep.train.backend_protocol import ManagedAllocator
from ghsweep.train.flops import ModelShape, run_flops_per_token
from ghsweep.train.packed_attention import attended_keys_per_token
from ghsweep.train.phases import Phases
from ghsweep.train.step_log import StepLog
from ghsweep.train.summary_builder import capture_window, run_peak_gib, run_summary
from ghsweep.train.tokenizer import load_tokenizer


def _single_process_env() -> None:
    """torch.distributed's environment for one process, unless a launcher (torchrun, SLURM) set it."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)


def _measured_recipe(config: ConfigSchema, run_dir: Path, tokens_per_step: int) -> Any:
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
            self.train_started_at = time.time()
            # Closed however the loop ends: the capture window and metrics.jsonl cover what ran.
            with (
                StepLog(run_dir / METRICS, device, tokens_per_step) as self.step_log,
                # Unprofiled, cudaProfilerStart/Stop do nothing.
                Phases(device, capture_window(config, profiled=True)) as self.phases,
            ):
                super().run_train_validation_loop()
            self.train_ended_at = time.time()

        def _run_train_optim_step(self, batches, max_grad_norm=None):
            step = self.steps_done
            with self.phases.step(step):
                started = self.step_log.start()
                sample = super()._run_train_optim_step(batches, max_grad_norm)
                self.step_log.end(step, torch.tensor(sample.metrics["loss"]), started)
            self.steps_done += 1
            self.peak_gib = max(self.peak_gib, sample.metrics["mem"])
            self.step_log.flush_due(self.steps_done, config.train.max_steps, config.train.log_every, progress=True)
            return sample

    return MeasuredRecipe


def train(config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None) -> RunSummary:
    """Run the AutoModel recipe `config` maps to; metrics.jsonl as the torch backend's; return the summary."""
    import nemo_automodel
    from nemo_automodel.components.config.loader import load_yaml_config

    setup_at = time.time()
    if not torch.cuda.is_available():
        raise RuntimeError("backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL)")
    _single_process_env()
    recipe_cfg = recipe_config(config, run_dir, "cuda")
    recipe_path = write_recipe(recipe_cfg, run_dir)
    tokens_per_step = config.train.micro_batch_size * config.train.seq_length
    recipe = _measured_recipe(config, run_dir, tokens_per_step)(load_yaml_config(str(recipe_path)))
    recipe.setup()
    model = recipe.model_parts[0]
    params = (sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad))
    recipe.run_train_validation_loop()

    device = torch.device("cuda", torch.cuda.current_device())
    shape = ModelShape.from_hf(model.config.to_dict())
    # The blocks the recipe's dataset packed (packed_dolly), for the attention FLOPs of document masking.
    blocks = dolly.load_blocks(config, load_tokenizer(config))
    flops = run_flops_per_token(
        shape, config, attended_keys_per_token(blocks.position_ids, config.data.packing_mask == "document")
    )
    info = {
        "automodel_version": nemo_automodel.__version__,
        "packed_blocks": len(blocks),
        "examples_dropped_too_long": blocks.dropped,
        "dataloader_workers": config.dataloader.num_workers,
        "compiled": recipe_cfg["compile"]["enabled"],
        "attention": recipe_cfg["model"]["attn_implementation"],
    }
    if config.precision.name == "fp8":
        info["fp8_library"] = "torchao"
    # One process: _single_process_env, AutoModel's FSDP2 over one GPU.
    return run_summary(
        config,
        recipe.step_log,
        device,
        peak_gib=run_peak_gib(managed, lambda: recipe.peak_gib),
        flops_per_token=flops,
        gpus=1,
        params=params,
        random_init=not config.model.path,
        offload_applied=False,
        captured=capture_window(config, plan.profile.used != "none"),
        managed=managed,
        setup_at=setup_at,
        train_started_at=recipe.train_started_at,
        train_ended_at=recipe.train_ended_at,
        capture_s=recipe.phases.capture_s,
        info=info,
    )
