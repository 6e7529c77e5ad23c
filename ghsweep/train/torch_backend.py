"""The PyTorch training loop: transformers Llama, LoRA through peft or full fine-tuning, dolly data.

On a GPU each knob does what its name says: precision sets parameter dtypes and fp8 layers
(precision.py, fp8.py), offload parks the first layers' activations in pinned host memory
(offload.py), memory=unified serves every CUDA allocation from managed memory (unified_memory.py),
and train.compile compiles each decoder layer and the loss (train.activation_memory_budget: how
much of their saved activations the compiled layers keep). The optimizer is fused AdamW (optim.py),
or with train.optimizer_in_backward one AdamW per tensor stepped during backward. With several ranks
(torchrun or SLURM tasks) each trains its share of the data under DDP or FSDP2 (distributed.py) and
rank 0 writes the records.
"""

from __future__ import annotations

import platform
import resource
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from ghsweep.profile.torch_capture import torch_capture
from ghsweep.train import distributed
from ghsweep.train import attention as attn
from ghsweep.train import data as dolly
from ghsweep.launch.world import data_parallel
from ghsweep.train.flops import ModelShape, add_throughput_metrics, run_flops_per_token
from ghsweep.train.loss import causal_lm_loss
from ghsweep.train.model import apply_peft, build_model, count_parameters, pad_token_id
from ghsweep.train.optim import AdamStepsInBackward, make_optimizer
from ghsweep.train.phases import Phases
from ghsweep.train.precision import Precision
from ghsweep.train.step_log import StepLog
from ghsweep.train.unified_memory import ManagedMemory


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return "cpu: " + line.split(":", 1)[1].strip()
    return "cpu: " + (platform.processor() or platform.machine())


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory the run needed: allocated device memory on a GPU, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def load_blocks(cfg: DictConfig, tokenizer) -> dolly.PackedBlocks:
    records = dolly.load_records(cfg.data, cfg.seed, cfg.train.seq_length, tokenizer)
    examples = (dolly.tokenize(r, tokenizer) for r in records)
    return dolly.pack(examples, cfg.train.seq_length, pad_token_id(tokenizer))


def train(cfg: DictConfig, run_dir: Path, managed: ManagedMemory | None = None) -> dict:
    """Train `cfg.train.max_steps` steps; write metrics.jsonl; return the run's summary.

    With memory=unified, `managed` is the managed-memory allocator the worker set up before
    anything touched CUDA (unified_memory.setup_unified_memory).
    """
    t_setup = time.time()
    ranks = distributed.ranks_from_env()
    device = distributed.rank_device(resolve_device(cfg.device), ranks)
    distributed.start(ranks, device)
    try:
        return _train(cfg, run_dir, managed, ranks, device, t_setup)
    finally:
        distributed.stop(ranks)


def _train(cfg: DictConfig, run_dir: Path, managed: ManagedMemory | None, ranks: distributed.Ranks,
           device: torch.device, t_setup: float) -> dict:
    # The same seed on every rank: the same initial weights (DDP and FSDP2 start from them unbroadcast).
    torch.manual_seed(cfg.seed)
    precision = Precision(cfg.precision, device)
    lora = cfg.peft.name == "lora"
    attention = attn.PackedAttention(attn.resolve(cfg.train.attention, cfg.data.packing_mask, device.type),
                                     cfg.data.packing_mask)

    model, tokenizer, random_init = build_model(
        cfg.model, device, precision.frozen_dtype if lora else precision.trained_dtype, attention.hf_implementation
    )
    model = apply_peft(model, cfg.peft, precision.trained_dtype)
    params_total, params_trainable = count_parameters(model)
    fp8_library = None
    if precision.name == "fp8":
        from ghsweep.train.fp8 import apply_fp8

        fp8_library = apply_fp8(model, cfg.precision, precision, fsdp_all_gather=data_parallel(cfg) == "fsdp")
    model.train()

    causal_lm = model.get_base_model() if lora else model
    decoder, lm_head = causal_lm.model, causal_lm.lm_head
    compile_enabled = cfg.train.compile is True or (cfg.train.compile == "auto" and device.type == "cuda")
    loss_fn = causal_lm_loss
    if compile_enabled:
        for layer in decoder.layers:
            layer.compile()
        loss_fn = torch.compile(causal_lm_loss)
    train_step, parallel = distributed.parallelize(distributed.TrainStep(decoder, lm_head, loss_fn), cfg, ranks)
    offload = None
    if cfg.offload.enabled and device.type == "cuda":
        from ghsweep.train.offload import ActivationOffload

        offload = ActivationOffload(decoder.layers, cfg.offload.num_layers)

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
        rank=ranks.rank,
        world_size=ranks.world_size,
    )
    # After parallelize: FSDP2 replaced the parameters with their shards.
    trained = [p for p in train_step.parameters() if p.requires_grad]
    if cfg.train.optimizer_in_backward:
        steps_in_backward = AdamStepsInBackward(trained, cfg.train, device)
    else:
        optimizer, schedule = make_optimizer(trained, cfg.train, device)
    # The global batch: every rank trains micro_batch_size blocks per step.
    tokens_per_step = cfg.train.micro_batch_size * cfg.train.seq_length * ranks.world_size
    log = StepLog(run_dir / "metrics.jsonl" if ranks.is_main else None, device, tokens_per_step)
    batches = dolly.endless(loader)
    setup_s = time.time() - t_setup

    phases = Phases(device, cfg.capture.start_step, cfg.capture.num_steps)
    profiler = torch_capture(run_dir, device, cfg.capture.start_step, cfg.capture.num_steps, ranks.rank)
    t_train = time.time()
    # The partitioner reads the budget when each compiled region is first traced (in the first step).
    with torch._functorch.config.patch(activation_memory_budget=cfg.train.activation_memory_budget):
        for step in range(cfg.train.max_steps):
            profiler.step(step)
            with phases.step(step):
                started = log.start()
                with phases.range("data"):
                    batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
                with phases.range("forward"), precision.forward_region(), attention.region():
                    loss = train_step(batch["input_ids"], batch["labels"], **attention.decoder_kwargs(batch))
                with phases.range("backward"):
                    precision.backward(loss)
                with phases.range("optimizer"):
                    if cfg.train.optimizer_in_backward:
                        steps_in_backward.end_step()
                    else:
                        precision.step(optimizer, trained, cfg.train.grad_clip)
                        schedule.step()
                        optimizer.zero_grad(set_to_none=True)
                    distributed.after_optimizer_step(train_step, parallel, fp8_library)
                log.end(step, loss, started)
            if (step + 1) % cfg.train.log_every == 0 or step + 1 == cfg.train.max_steps:
                log.flush()
                if ranks.is_main:
                    print(f"step {step + 1}/{cfg.train.max_steps} loss {log.losses[-1]:.4f} "
                          f"step_time_ms {log.step_times_ms[-1]:.1f}", flush=True)
    profiler.close()
    phases.close()
    log.close()
    train_s = time.time() - t_train

    metrics = log.summary(cfg.train.warmup_steps)
    managed_peak = managed.peak_gib() if managed else None
    peak_gib = managed_peak if managed_peak is not None else peak_memory_gib(device)
    ranks_seen = distributed.rank_summary(distributed.gather(log.step_times_ms, ranks),
                                          distributed.gather(peak_gib, ranks), cfg.train.warmup_steps)
    metrics["peak_mem_gb"] = max(ranks_seen["rank_peak_mem_gb"])
    name = device_name(device)
    shape = ModelShape(**{k: causal_lm.config.to_dict()[k] for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")},
        num_layers=causal_lm.config.num_hidden_layers)
    flops = run_flops_per_token(shape, cfg, attn.attended_keys_per_token(blocks.position_ids, attention.document))
    peak = add_throughput_metrics(metrics, flops, name, precision.name, gpus=ranks.world_size)
    metrics["world_size"] = ranks.world_size
    metrics["tokens_per_s_per_gpu"] = metrics["tokens_per_s"] / ranks.world_size
    if ranks.world_size > 1:
        metrics |= {k: ranks_seen[k] for k in ("slowest_rank", "slowest_rank_step_time_ms", "rank_spread_pct")}
    info = {
        "device": str(device),
        "device_name": name,
        "torch_version": torch.__version__,
        "random_init": random_init,
        "params_total": params_total,
        "params_trainable": params_trainable,
        "packed_blocks": len(blocks),
        "examples_dropped_too_long": blocks.dropped,
        "dataloader_workers": loader.num_workers,
        "compiled": compile_enabled,
        "attention": attention.implementation,
        "flops_per_token": flops,
        "mfu_peak_tflops": peak,
        # Activation offload moves saved tensors from GPU to host memory; on the CPU they already live there.
        "offload_applied": offload is not None,
        "data_parallel": parallel or "none",
    }
    if ranks.world_size > 1:
        info["rank_step_time_ms"] = " ".join(f"{t:.1f}" for t in ranks_seen["rank_step_time_ms"])
    if offload is not None:
        info["offload_gb_per_step"] = offload.bytes_offloaded / 2**30 / cfg.train.max_steps
    if fp8_library:
        info["fp8_library"] = fp8_library
    if managed:
        info["unified_allocator"] = managed.allocator
    return {"metrics": metrics, "timing": {"setup_s": setup_s, "train_s": train_s}, "info": info}
