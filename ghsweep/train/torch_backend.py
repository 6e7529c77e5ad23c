"""The PyTorch training loop: transformers Llama, peft LoRA or full fine-tuning, dolly data."""

from __future__ import annotations

import platform
import resource
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from ghsweep.train import data as dolly
from ghsweep.train.model import apply_peft, build_model, count_parameters, pad_token_id
from ghsweep.train.phases import Phases
from ghsweep.train.precision import Precision
from ghsweep.train.step_log import StepLog


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return "cpu: " + line.split(":", 1)[1].strip()
    return "cpu: " + (platform.processor() or platform.machine())


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory the run needed: allocated device memory on a GPU, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def load_blocks(cfg: DictConfig, tokenizer) -> dolly.PackedBlocks:
    if cfg.data.path:
        records = dolly.load_dolly_jsonl(cfg.data.path, cfg.data.num_examples)
    else:
        records = dolly.synthetic_dolly(cfg.data.num_examples, seed=cfg.seed)
    examples = (dolly.tokenize(r, tokenizer) for r in records)
    return dolly.pack(examples, cfg.train.seq_length, pad_token_id(tokenizer))


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train `cfg.train.max_steps` steps; write metrics.jsonl; return the run's summary."""
    t_setup = time.time()
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    precision = Precision(cfg.precision, device)

    model, tokenizer, random_init = build_model(cfg.model)
    model = apply_peft(model, cfg.peft)
    model.to(device)
    model.train()
    params_total, params_trainable = count_parameters(model)

    blocks = load_blocks(cfg, tokenizer)
    dl = cfg.dataloader
    loader = dolly.make_dataloader(
        blocks,
        batch_size=cfg.train.micro_batch_size,
        seed=cfg.seed,
        num_workers=dl.num_workers,
        pin_memory=dl.pin_memory and device.type == "cuda",
        prefetch_factor=dl.prefetch_factor,
        persistent_workers=dl.persistent_workers,
    )
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.train.lr,
        weight_decay=cfg.train.weight_decay,
        fused=device.type == "cuda",
    )
    tokens_per_step = cfg.train.micro_batch_size * cfg.train.seq_length
    log = StepLog(run_dir / "metrics.jsonl", device, tokens_per_step)
    batches = dolly.endless(loader)
    setup_s = time.time() - t_setup

    phases = Phases(device, cfg.capture.start_step, cfg.capture.num_steps)
    t_train = time.time()
    for step in range(cfg.train.max_steps):
        with phases.step(step):
            started = log.start()
            with phases.range("data"):
                batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            with phases.range("forward"), precision.autocast():
                loss = model(**batch, use_cache=False).loss
            with phases.range("backward"):
                precision.backward(loss)
            with phases.range("optimizer"):
                precision.step(optimizer)
                optimizer.zero_grad(set_to_none=True)
            log.end(step, loss, started)
        if (step + 1) % cfg.train.log_every == 0 or step + 1 == cfg.train.max_steps:
            log.flush()
            print(f"step {step + 1}/{cfg.train.max_steps} loss {log.losses[-1]:.4f} "
                  f"step_time_ms {log.step_times_ms[-1]:.1f}", flush=True)
    phases.close()
    log.close()
    train_s = time.time() - t_train

    metrics = log.summary(cfg.train.warmup_steps)
    metrics["peak_mem_gb"] = peak_memory_gib(device)
    return {
        "metrics": metrics,
        "timing": {"setup_s": setup_s, "train_s": train_s},
        "info": {
            "device": str(device),
            "device_name": device_name(device),
            "torch_version": torch.__version__,
            "random_init": random_init,
            "params_total": params_total,
            "params_trainable": params_trainable,
            "packed_blocks": len(blocks),
            "examples_dropped_too_long": blocks.dropped,
            "dataloader_workers": loader.num_workers,
            # Activation offload moves saved tensors from GPU to host memory; on the CPU they
            # already live there.
            "offload_applied": bool(cfg.offload.enabled) and device.type == "cuda",
        },
    }
