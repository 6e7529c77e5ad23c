"""The worker summary every backend returns: one assembly, so MLflow cannot tell the backends apart."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ghsweep.config.schema import ConfigSchema, capture_steps
from ghsweep.core.run_summary import RunSummary
from ghsweep.train.backend_protocol import ManagedAllocator
from ghsweep.train.device import device_name, device_uuid
from ghsweep.train.flops import add_throughput_metrics
from ghsweep.train.step_log import StepLog


def run_peak_gib(managed: ManagedAllocator | None, measured_gib: Callable[[], float]) -> float:
    """The managed-memory allocator's peak where it knows one (the device counter misses managed
    memory), else what the backend measures. `measured_gib` is called only then: under a pluggable
    allocator torch's device counters raise."""
    managed_peak = managed.peak_gib() if managed else None
    return managed_peak if managed_peak is not None else measured_gib()


# dynamo's timers (torch._dynamo.utils.compilation_time_metrics, seconds per call): every frame's
# compile, tracing and the backend (Inductor, or its caches) together; and the backward graph's, which
# AOTAutograd compiles when the first backward reaches it, outside the frame's (timed only then).
FRAME_COMPILE = "_compile.compile_inner"
BACKWARD_COMPILE = "backward._backward_impl"


def compile_seconds() -> float | None:
    """Seconds this process spent in torch.compile (tracing, compiling or loading from the caches);
    None when nothing imported dynamo (nothing was compiled)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    times = getattr(dynamo_utils, "compilation_time_metrics", None)
    if times is None:
        return None
    return sum((sum(times.get(name, ())) for name in (FRAME_COMPILE, BACKWARD_COMPILE)), 0.0)


def capture_window(config: ConfigSchema, profiled: bool) -> range:
    """The steps a profiler records in a run of train.max_steps steps (none when it is not profiled),
    left out of the steady steps whatever the profiler costs them."""
    if not profiled:
        return range(0)
    return capture_steps(config.capture, config.train.max_steps)


@dataclass
class SetupParts:
    """How long each part of a worker's set-up took, timed one after the other from `last`
    (ghsweep.core.run_result.SETUP_PARTS: where a later combination's set-up goes)."""

    last: float
    seconds: dict[str, float] = field(default_factory=dict)

    def done(self, part: str) -> None:
        now = time.time()
        self.seconds[part], self.last = now - self.last, now


def run_summary(
    config: ConfigSchema,
    log: StepLog,
    device: torch.device,
    *,
    peak_gib: float,
    flops_per_token: float,
    gpus: int,
    params: tuple[int, int],
    random_init: bool,
    offload_applied: bool,
    captured: range,
    managed: ManagedAllocator | None,
    setup_at: float,
    train_started_at: float,
    train_ended_at: float,
    capture_s: float | None = None,
    setup_parts: SetupParts | None = None,
    metrics: dict[str, float] | None = None,
    info: dict[str, object] | None = None,
) -> RunSummary:
    """The run's summary from its step log and facts; `metrics` and `info` add the backend's own.

    `params`: (total, trainable) parameter counts. `captured`: the steps a profiler recorded
    (capture_window; left out of the steady steps). `setup_at`: when the backend started setting up
    (after its imports), `train_started_at` / `train_ended_at`: the training loop's edges. `capture_s`:
    the loop's time spent starting and stopping the profiler's capture window (Phases.capture_s).
    `setup_parts`: the parts of the set-up, as the backend timed them.
    """
    name = device_name(device)
    measured = log.summary(config.train.warmup_steps, captured) | {"peak_mem_gb": peak_gib}
    # Where the worker measures the GPU's mean power (energy per token) from its system metrics.
    steady = log.steady_window(config.train.warmup_steps, captured)
    window = {"steady_from": steady[0], "steady_to": steady[1]} if steady else {}
    peak_tflops = add_throughput_metrics(measured, flops_per_token, name, config.precision.name, gpus=gpus)
    # Per-GPU throughput: the comparison's scaling column reads it.
    measured |= {"world_size": gpus, "tokens_per_s_per_gpu": measured["tokens_per_s"] / gpus}
    facts: dict[str, object] = {
        "device": str(device),
        "device_name": name,
        **({"device_uuid": uuid} if (uuid := device_uuid(device)) else {}),
        # Which of the machine's GPUs the launch gave the run (a local sweep spreads its runs over them).
        **({"cuda_visible_devices": gpus_given} if (gpus_given := os.environ.get("CUDA_VISIBLE_DEVICES")) else {}),
        "torch_version": torch.__version__,
        "random_init": random_init,
        "params_total": params[0],
        "params_trainable": params[1],
        "flops_per_token": flops_per_token,
        "mfu_peak_tflops": peak_tflops,
        "offload_applied": offload_applied,
    }
    if managed:
        facts["unified_allocator"] = managed.allocator
    return RunSummary(
        metrics=measured | (metrics or {}),
        # setup_at: the worker counts the time before it as import_s.
        timing={
            "setup_at": setup_at,
            "setup_s": train_started_at - setup_at,
            **(setup_parts.seconds if setup_parts else {}),
            "train_s": train_ended_at - train_started_at,
            # Parts of train_s outside the steady steps: where a run's first steps went.
            **({"compile_s": compile_s} if (compile_s := compile_seconds()) is not None else {}),
            **({"capture_s": capture_s} if capture_s is not None else {}),
            **window,
        },
        info=facts | (info or {}),
    )
