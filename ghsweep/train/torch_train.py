"""The PyTorch training loop: transformers Llama, LoRA through peft or full fine-tuning, dolly data.

On a GPU each knob does what its name says: precision sets parameter dtypes and fp8 layers
(precision.py, fp8.py), offload parks the first layers' activations in pinned host memory
(offload.py), memory=unified serves every CUDA allocation from managed memory (unified_memory.py),
and train.compile compiles each decoder layer and the loss (train.activation_memory_budget: how
much of their saved activations the compiled layers keep). The optimizer is AdamW (optimizer.py:
torch's fused one, or torchao's with stochastic rounding for bf16 weights, train.optimizer), or with
train.optimizer_in_backward one AdamW per tensor stepped during backward. With several ranks
(torchrun or SLURM tasks) each trains its share of the data under DDP or FSDP2 (distributed.py) and
rank 0 writes the records.

`train` reads as its steps: build the model, the data and the optimizer step, run the loop, summarise.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ghsweep.capture.torch_capture import torch_capture
from ghsweep.config.schema import ConfigSchema, PeftSchema, TrainSchema
from ghsweep.core.atomic import wait_for_file
from ghsweep.core.run_dir import METRICS
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_summary import RunSummary
from ghsweep.train import distributed
from ghsweep.train import dolly_data as dolly
from ghsweep.train import packed_attention as attn
from ghsweep.train.backend_protocol import ManagedAllocator
from ghsweep.train.compile_cache import cache_counts, use_compile_cache
from ghsweep.train.device import peak_memory_gib
from ghsweep.train.flops import ModelShape, run_flops_per_token
from ghsweep.train.fp8_cached import TrainedFp8Linear
from ghsweep.train.gc_pauses import GcPauses
from ghsweep.train.loss import causal_lm_loss
from ghsweep.train.memory_record import PeakBreakdown
from ghsweep.train.model import apply_peft, build_model, count_parameters
from ghsweep.train.offload import ActivationOffload
from ghsweep.train.optimizer import AdamStepsInBackward, make_optimizer, optimizer_for
from ghsweep.train.phases import HandedCollection, Phases
from ghsweep.train.precision import Precision
from ghsweep.train.step_log import Measure, StepLog, measured_length
from ghsweep.train.summary_builder import SetupParts, capture_window, run_peak_gib, run_summary
from ghsweep.train.tokenizer import load_tokenizer

# The longest a run waits for the sweep's work on earlier runs (their analysis and records).
SWEEP_WAIT_S = 600
# How often that wait looks whether the sweep directory is still there.
SWEEP_GONE_CHECK_S = 1.0


@dataclass
class Model:
    """The model as the loop trains it, and what the summary reports of how it was built."""

    train_step: nn.Module  # decoder, LM head and loss; under DDP or FSDP2 with several ranks
    hf_config: Any  # transformers' config of the causal LM (its shape)
    tokenizer: Any
    random_init: bool
    params: tuple[int, int]  # (total, trainable), before sharding
    compiled: bool
    data_parallel: str | None  # ddp | fsdp with several ranks, else None
    reduce_dtype: str | None  # fp32 | param (what gradients are summed in) with several ranks, else None
    fp8_library: str | None
    fp8_layers: list[TrainedFp8Linear]  # trained weights whose fp8 copies each optimizer step remakes
    offload: ActivationOffload | None

    def trained_parameters(self) -> list[nn.Parameter]:
        # Read after parallelize: FSDP2 replaced the parameters with their shards.
        return [p for p in self.train_step.parameters() if p.requires_grad]


class OptimizerStep:
    """One optimizer step after backward: AdamW (`kind`, see optimizer.optimizer_for) with its schedule, or
    (train.optimizer_in_backward) the end of the per-tensor AdamW steps that ran during backward; then
    the fp8 copies of `fp8_layers`' weights that the optimizer's kernel did not write."""

    def __init__(
        self,
        trained: list[nn.Parameter],
        train: TrainSchema,
        device: torch.device,
        precision: Precision,
        kind: str,
        fp8_layers: list[TrainedFp8Linear],
    ):
        self._trained, self._grad_clip, self._precision = trained, train.grad_clip, precision
        self._fp8_layers, self._steps = fp8_layers, 0
        self._in_backward = AdamStepsInBackward(trained, train, device, kind) if train.optimizer_in_backward else None
        if self._in_backward is None:
            self._optimizer, self._schedule = make_optimizer(trained, train, device, kind)
            if hasattr(self._optimizer, "fp8_layers"):  # adamw_sr: its kernel writes the copies
                self._optimizer.fp8_layers = {layer.weight: layer for layer in fp8_layers}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer holding state: one, or one per tensor stepped in backward."""
        return list(self._in_backward.optimizers.values()) if self._in_backward is not None else [self._optimizer]

    def __call__(self) -> None:
        if self._in_backward is not None:
            self._in_backward.end_step()
        else:
            self._precision.step(self._optimizer, self._trained, self._grad_clip)
            self._schedule.step()
            self._optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        for layer in self._fp8_layers:
            if layer.casts < self._steps:
                layer.cast()


def compile_settings(activation_memory_budget: float, device: torch.device) -> dict[str, Any]:
    """torch._functorch.config for the compiled layers.

    Under a budget below 1 the partitioner picks what to recompute by cost. On a GPU it times each
    candidate op there; its default estimate counts FLOPs only, so every memory-bound op looks free to
    redo (budget 0.45 with 17 offloaded layers on an H200: 1.185x the step time with FLOP estimates,
    1.155x with timed ones, in two runs).

    AOTAutograd's cache keeps graphs that call a custom autograd.Function (fp8_cached's fp8 GEMM):
    without this it bypasses them, and every fp8 worker traced and partitioned its layers' joint graph
    again (3.5-4 s of each fp8 combination's first step on an H200, on a warm cache). The function's
    forward and backward are traced into the graph, so they are part of its cache key (torch's flag,
    pytorch/pytorch#149751, off by default only until torch has tested it more widely).
    """
    settings: dict[str, Any] = {
        "activation_memory_budget": activation_memory_budget,
        "activation_memory_budget_runtime_estimator": "profile" if device.type == "cuda" else "flops",
    }
    # A setting of torch 2.7 on (the floor is 2.6); before it, the cache bypasses them.
    if hasattr(torch._functorch.config, "autograd_cache_allow_custom_autograd_functions"):
        settings["autograd_cache_allow_custom_autograd_functions"] = True
    return settings


def groups_adapter_gemms(peft: PeftSchema, compiled: bool) -> bool:
    """Whether LoRA's A GEMMs of one input run as one GEMM (adapter_gemms.py): peft.adapter_gemms=grouped
    where the layers compile."""
    return compiled and peft.name == "lora" and peft.adapter_gemms == "grouped"


def scales_adapter_weights(peft: PeftSchema, compiled: bool) -> bool:
    """Whether LoRA's scale multiplies B rather than B's output (adapter_gemms.py): peft.adapter_scale=weight
    where the layers compile."""
    return compiled and peft.name == "lora" and peft.adapter_scale == "weight"


def adapter_gemm_passes(peft: PeftSchema, compiled: bool) -> contextlib.AbstractContextManager:
    """torch.compile's pass over LoRA's GEMMs (adapter_gemms.py), with what groups_adapter_gemms and
    scales_adapter_weights choose; where neither, nothing."""
    group, scale_weights = groups_adapter_gemms(peft, compiled), scales_adapter_weights(peft, compiled)
    if not (group or scale_weights):
        return contextlib.nullcontext()
    import torch._inductor.config  # torch.compile imports it: only the setting is new

    from ghsweep.train.adapter_gemms import AdapterGemmPasses

    return torch._inductor.config.patch(pre_grad_custom_pass=AdapterGemmPasses(group, scale_weights))


def compile_in_this_process() -> None:
    """Inductor compiles in the worker's own process rather than in its pool (a sidecar process and
    one worker process a core, up to 32), unless TORCHINDUCTOR_COMPILE_THREADS says otherwise. For
    a run that nsys records: every process of the pool is traced in the run's collection, which
    they slow down. Measured on one H200 (benchmarks/h200_nsys_handoff.json): the default line's
    capture stop held each worker 8.0-8.9 s with the pool and 7.0-7.6 s without; a collection
    handed to its worker (profile.nsys.handoff) took 35-38 s to write when the pool was killed with
    the worker, 9.5-10.9 s when the worker ended it first, and 5.0-7.4 s with no pool. The tiny
    model's cold compile took as long either way (25.2 and 27.8 s with the pool, 23.8 and 29.1 s
    without): its kernels are few and small."""
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        import torch._inductor.config  # imported with transformers already: only the setting is new

        torch._inductor.config.compile_threads = 1


def train(config: ConfigSchema, plan: RunPlan, run_dir: Path, managed: ManagedAllocator | None = None) -> RunSummary:
    """Train `config.train.max_steps` steps; write metrics.jsonl; return the run's summary.

    With memory=unified, `managed` is the managed-memory allocator the worker set up before
    anything touched CUDA (unified_memory.setup_unified_memory).
    """
    setup_at = time.time()
    if plan.profile.used == "nsys":
        compile_in_this_process()
    ranks = distributed.ranks_from_env()
    device = distributed.rank_device(torch.device(plan.device), ranks)
    gather = distributed.fsdp_all_gather(config, ranks, plan.data_parallel, device)
    distributed.start(ranks, device, copy_engine=gather == "copy_engine")
    try:
        return _train(config, plan, run_dir, managed, ranks, device, setup_at)
    finally:
        distributed.stop(ranks)


def _train(
    config: ConfigSchema,
    plan: RunPlan,
    run_dir: Path,
    managed: ManagedAllocator | None,
    ranks: distributed.Ranks,
    device: torch.device,
    setup_at: float,
) -> RunSummary:
    setup = SetupParts(setup_at)
    torch.empty(0, device=device)  # the device's context, made here so that it is timed apart from the model
    setup.done("device_s")
    # The same seed on every rank: the same initial weights (DDP and FSDP2 start from them unbroadcast).
    torch.manual_seed(config.seed)
    precision = Precision(config.precision, device)
    attention = attn.PackedAttention(
        attn.resolve(config.train.attention, config.data.packing_mask, device.type), config.data.packing_mask
    )
    optimizer = optimizer_for(config.train.optimizer, config.peft.name, precision.trained_dtype)
    model = build(config, plan, ranks, device, precision, attention, optimizer)
    setup.done("model_s")
    dataset = dolly.load_dataset(config, model.tokenizer)
    loader = make_loader(config, dataset, ranks, device)
    setup.done("data_s")
    optimizer_step = OptimizerStep(
        model.trained_parameters(), config.train, device, precision, optimizer, model.fp8_layers
    )
    setup.done("optimizer_s")
    # The global batch: every rank trains micro_batch_size blocks per step.
    tokens_per_step = config.train.micro_batch_size * config.train.seq_length * ranks.world_size
    log = StepLog(run_dir / METRICS if ranks.is_main else None, device, tokens_per_step)

    profiled = plan.profile.used != "none"
    # capture.start_step=auto where train.measure decides the length: the window follows the measurement.
    capture_after = profiled and config.capture.start_step == "auto" and measured_length(config, device.type)
    window = None if capture_after else capture_window(config, profiled)
    measure = Measure.from_config(config, device.type, window or range(0), plan.prune_below_tokens_per_s)
    # Under the managed-memory allocator torch's device counters raise: no breakdown there.
    breakdown = PeakBreakdown(device) if device.type == "cuda" and managed is None else None
    train_started_at = time.time()
    # Closed however the loop ends: the trace and the capture window cover what ran, metrics.jsonl is complete.
    with (
        log,
        Phases(device, window, HandedCollection.of_this_worker(run_dir)) as phases,
        torch_capture(plan.profile, run_dir, device, window, ranks.rank) as profiler,
        # Read when each compiled region is first traced (in the first step): the budget and the cache.
        torch._functorch.config.patch(**compile_settings(config.train.activation_memory_budget, device)),
        adapter_gemm_passes(config.peft, model.compiled),
        GcPauses(config.train.gc_interval) as gc_pauses,
    ):
        # An auto window trains the run's first blocks again, so every run profiles the same data.
        batches = dolly.CapturedBlocks(
            dolly.endless(loader), config.capture.num_steps, replay=config.capture.start_step == "auto"
        )
        step, stop = 0, None
        # The sweep's work on earlier runs ends before the first step measured or profiled (a capture
        # window may start before the warm-up ends); profile.overhead checks that it did.
        first_watched = min(config.train.warmup_steps, window.start) if window else config.train.warmup_steps
        while stop is None or (window is not None and step < window.stop):
            if step == first_watched and plan.measure_after:
                wait_for_the_sweep(Path(plan.measure_after))
            profiler.step(step)
            with phases.step(step):
                started = log.start()
                with phases.range("data"):
                    host_batch = batches.batch(step, window)
                    batch = {k: v.to(device, non_blocking=True) for k, v in host_batch.items()}
                    decoder_kwargs = attention.decoder_kwargs(batch["position_ids"], host_batch["position_ids"])
                # Each read of the allocator's counters builds its whole stats dict (py-spy: about 0.8 ms of
                # a tiny model's step for the two); a step's activations are the same in every step, so
                # only the warm-up steps, never measured, read them (the first step at least).
                watched = breakdown if breakdown and step < max(config.train.warmup_steps, 1) else None
                with phases.range("forward"), precision.forward_region(), attention.region():
                    if watched:
                        watched.forward_started()
                    loss = model.train_step(batch["input_ids"], batch["labels"], **decoder_kwargs)
                    if watched:
                        watched.forward_ended()
                with phases.range("backward"):
                    precision.backward(loss)
                with phases.range("optimizer"):
                    optimizer_step()
                    distributed.after_optimizer_step(model.train_step, model.data_parallel, model.fp8_library)
                gc_pauses.step_done(step)
                log.end(step, loss, started)
            step += 1
            if stop is None and log.flush_due(step, measure.min_steps, config.train.log_every, progress=ranks.is_main):
                # Every rank flushes at the same steps; rank 0's interval decides for all of them.
                stop = distributed.from_rank0(measure.stop(log, step, time.time() - train_started_at), ranks)
                if stop is not None and window is None:
                    window = range(step, step + config.capture.num_steps)
                    phases.open_window(window)
                    profiler.open_window(window)
    train_ended_at = time.time()

    peak_gib = run_peak_gib(managed, lambda: peak_memory_gib(device))
    ranks_seen = distributed.rank_summary(
        distributed.gather(log.step_times_ms, ranks), distributed.gather(peak_gib, ranks), config.train.warmup_steps
    )
    shape = ModelShape.from_hf(model.hf_config.to_dict())
    flops = run_flops_per_token(shape, config, attn.attended_keys_per_token(dataset.position_ids(), attention.document))
    metrics, info = (
        {},
        {
            "packed_blocks": len(dataset),
            "examples_dropped_too_long": dataset.dropped,
            "dataloader_workers": loader.num_workers,
            "compiled": model.compiled,
            **cache_counts(),
            "attention": attention.implementation,
            "data_parallel": model.data_parallel or "none",
            "optimizer": optimizer,
            "measure_stop": stop,
        },
    )
    if ranks.world_size > 1:
        metrics = {k: ranks_seen[k] for k in ("slowest_rank", "slowest_rank_step_time_ms", "rank_spread_pct")}
        info["rank_step_time_ms"] = " ".join(f"{t:.1f}" for t in ranks_seen["rank_step_time_ms"])
        info["reduce_dtype"] = model.reduce_dtype
        if model.data_parallel == "fsdp":
            info["fsdp_all_gather"] = distributed.fsdp_all_gather(config, ranks, "fsdp", device)
    metrics |= gc_pauses.metrics(config.train.warmup_steps)
    if batches.fingerprint:
        info["captured_blocks"] = batches.fingerprint
    if model.offload is not None:
        info["offload_gb_per_step"] = model.offload.bytes_offloaded / 2**30 / step
    if model.fp8_library:
        info["fp8_library"] = model.fp8_library
    if config.peft.name == "lora":
        info["lora_adapter_gemms"] = "grouped" if groups_adapter_gemms(config.peft, model.compiled) else "separate"
        info["lora_adapter_scale"] = "weight" if scales_adapter_weights(config.peft, model.compiled) else "output"
    if breakdown:
        metrics |= breakdown.metrics(
            peak_gib,
            # Weights kept as buffers count too: fp8's quantised frozen weights replace their parameters.
            itertools.chain(model.train_step.parameters(), model.train_step.buffers()),
            model.trained_parameters(),
            optimizer_step.optimizers(),
        )
    return run_summary(
        config,
        log,
        device,
        peak_gib=max(ranks_seen["rank_peak_mem_gb"]),
        flops_per_token=flops,
        gpus=ranks.world_size,
        params=model.params,
        random_init=model.random_init,
        # Activation offload moves saved tensors from GPU to host memory; on the CPU they already live there.
        offload_applied=model.offload is not None,
        captured=window or range(0),
        managed=managed,
        setup_at=setup_at,
        train_started_at=train_started_at,
        train_ended_at=train_ended_at,
        capture_s=phases.capture_s,
        setup_parts=setup,
        metrics=metrics,
        info=info,
    )


def wait_for_the_sweep(go: Path) -> None:
    """Wait, before the first step that may be measured, until the sweep has made `go`: its work on the
    runs before this one (their reports, analysis and records, on the sweep's follow-up thread) is done
    and runs beside none of this run's measured steps."""
    if go.exists():
        return
    print("ghsweep: waiting for the sweep's work on earlier runs before the measured steps", flush=True)
    waited = time.monotonic()
    while wait_for_file(go, SWEEP_GONE_CHECK_S) is None:
        if not go.parent.is_dir():  # the sweep directory was removed: no sweep will make `go`, or read this run
            raise RuntimeError(f"the run directory {go.parent} was removed while the run trained")
        if time.monotonic() - waited > SWEEP_WAIT_S:
            print(f"ghsweep: {go} not made after {SWEEP_WAIT_S} s; measuring anyway", flush=True)
            return
    print(f"ghsweep: waited {time.monotonic() - waited:.1f} s", flush=True)


def build(
    config: ConfigSchema,
    plan: RunPlan,
    ranks: distributed.Ranks,
    device: torch.device,
    precision: Precision,
    attention: attn.PackedAttention,
    optimizer: str,
) -> Model:
    """The model with its adapters, fp8 layers, compiled layers, data parallelism and activation offload;
    `optimizer` (optimizer.optimizer_for) is what will step its weights."""
    lora = config.peft.name == "lora"
    # A checkpoint's weights are read before its tokenizer, so a folder whose weights cannot be read says
    # that first; a model built from config takes its special tokens from the tokenizer.
    tokenizer = None if config.model.path else load_tokenizer(config)
    base, random_init = build_model(
        config.model,
        tokenizer,
        device,
        precision.frozen_dtype if lora else precision.trained_dtype,
        attention.hf_implementation,
    )
    tokenizer = tokenizer or load_tokenizer(config)
    # transformers' LlamaForCausalLM, in peft's LoRA wrapper with peft=lora: attributes typed by neither.
    hf_model: Any = apply_peft(base, config.peft, precision.trained_dtype)
    params = count_parameters(hf_model)
    fp8_library = None
    if precision.name == "fp8":
        from ghsweep.train.fp8 import apply_fp8

        fsdp = plan.data_parallel == "fsdp" and ranks.world_size > 1
        # torchao's fp8 all-gather wraps the trained weights in a tensor subclass that torch.compile, and so
        # torchao's own AdamW, cannot step; FSDP2 then gathers them in bf16.
        fp8_library = apply_fp8(
            hf_model, config.precision, precision, fsdp_sharded=fsdp, fsdp_all_gather=fsdp and optimizer == "adamw"
        )
    fp8_layers = [m for m in hf_model.modules() if isinstance(m, TrainedFp8Linear)]
    hf_model.train()

    causal_lm = hf_model.get_base_model() if lora else hf_model
    decoder = causal_lm.model
    compiled = config.train.compiles(device.type == "cuda")
    loss_fn = causal_lm_loss
    if compiled:
        # Before the first compile, in the first step: where its caches are read and written.
        use_compile_cache(config.train.compile_cache_dir, plan.gpu if device.type == "cuda" else None)
        for layer in decoder.layers:
            layer.compile()
        loss_fn = torch.compile(causal_lm_loss)
    train_step, parallel, reduce_dtype = distributed.parallelize(
        distributed.TrainStep(decoder, causal_lm.lm_head, loss_fn), config, ranks, plan.data_parallel
    )
    offload = None
    if config.offload.enabled and device.type == "cuda":
        ahead = config.offload.prefetch_layers
        assert ahead is not None, "OffloadSchema.check requires offload.prefetch_layers wherever offload is on"
        offload = ActivationOffload(decoder.layers, config.offload.num_layers, ahead)
    return Model(
        train_step,
        causal_lm.config,
        tokenizer,
        random_init,
        params,
        compiled,
        parallel,
        reduce_dtype,
        fp8_library,
        fp8_layers,
        offload,
    )


def make_loader(
    config: ConfigSchema, dataset: dolly.BlockDataset, ranks: distributed.Ranks, device: torch.device
) -> torch.utils.data.DataLoader:
    dl = config.dataloader
    return dolly.make_dataloader(
        dataset,
        batch_size=config.train.micro_batch_size,
        seed=config.seed,
        num_workers=dl.num_workers,
        pin_memory=dl.pin_memory and device.type == "cuda",
        prefetch_factor=dl.prefetch_factor,
        persistent_workers=dl.persistent_workers,
        rank=ranks.rank,
        world_size=ranks.world_size,
    )
