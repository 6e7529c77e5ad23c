"""The worker process: `python -m ghsweep.train.worker RUN_DIR` trains the combination planned in
RUN_DIR/run_plan.json with RUN_DIR/config.yaml and writes summary.json (or worker_error.json) beside them.

It runs in its own process so that nsys or a container can wrap it, CUDA can be set up before
anything touches it, and a crash cannot take the sweep down. It imports only what training needs:
the plan says what the job decided (device, profiler, data parallelism), nothing is decided again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ghsweep.config.schema import typed
from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import first_line
from ghsweep.core.run_dir import CONFIG, MEMORY_SNAPSHOT, WORKER_ERROR, rank_file
from ghsweep.core.run_plan import RunPlan
from ghsweep.train import memory_record
from ghsweep.train.backends import backend_named
from ghsweep.train.system_metrics import sampler_for, system_summary


def record_error(run_dir: Path, error: dict[str, str], started_at: float) -> None:
    """worker_error.json, unless another rank of this attempt wrote it first: with several ranks the
    first to fail explains the run (the others often fail because of it). A file older than this
    worker is an earlier attempt's in the same run directory (a fixed hydra.run.dir run again): it
    would name the wrong failure, so it is replaced."""
    path = run_dir / WORKER_ERROR
    text = json.dumps(error)
    try:
        with open(path, "x") as error_file:
            error_file.write(text)
    except FileExistsError:
        if path.stat().st_mtime >= started_at:
            return
        write_atomic(path, text)


# Library messages every worker.log would start with, that say nothing a user can act on: torchao's
# prebuilt kernels for other Pythons and GPUs that do not load here, and deprecations inside the
# libraries (torch's pytree of torchao's enums, transformers' renamed gradient-checkpointing flag).
LIBRARY_NOISE = {
    "torchao": "Failed to load ",
    "torch.utils._pytree": "is an Enum subclass and is now natively supported",
}
DEPRECATION_NOISE = r"`is_gradient_checkpointing` is deprecated"


def _without(noise: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: noise not in record.getMessage()


def quiet_library_noise() -> None:
    """Leave LIBRARY_NOISE out of the log; every other message of those libraries still shows."""
    for logger_name, noise in LIBRARY_NOISE.items():
        logging.getLogger(logger_name).addFilter(_without(noise))
    warnings.filterwarnings("ignore", message=DEPRECATION_NOISE, category=FutureWarning)


def main(argv: list[str]) -> int:
    quiet_library_noise()
    if len(argv) != 2:
        print("usage: python -m ghsweep.train.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    ready_at = time.time()
    recording = False
    try:
        plan = RunPlan.load(run_dir)
        composed = OmegaConf.load(run_dir / CONFIG)
        if not isinstance(composed, DictConfig):
            raise ValueError(f"{run_dir / CONFIG}: a list; accepted: the mapping of a composed config")
        config = typed(composed)  # validated by the job that wrote it
        backend = backend_named(plan.backend)
        managed = None
        if config.memory.name == "unified":
            # Before the backend's imports: transformers initialises CUDA on import, and the
            # allocator can only be swapped before that.
            from ghsweep.train.unified_memory import setup_unified_memory

            managed = setup_unified_memory(config.memory, plan.gpu)
        # The allocator's history, for the snapshot an out-of-memory error leaves; one rank only (before
        # the backend picks each rank's GPU, recording could start a CUDA context on the first one).
        recording = plan.device.startswith("cuda") and managed is None and os.environ.get("WORLD_SIZE", "1") == "1"
        if recording:
            memory_record.start_history()
        sampler = sampler_for(run_dir, config, plan)
        # Sampled from before the backend's imports to the end of training, whatever ends it.
        with sampler or contextlib.nullcontext():
            summary = backend.train(config, plan, run_dir, managed)
    except BaseException as exc:
        rank = os.environ.get("RANK")
        message = first_line(exc)
        if recording and memory_record.is_cuda_oom(exc):
            try:
                message = memory_record.on_oom(exc, run_dir / rank_file(MEMORY_SNAPSHOT, int(rank or 0)))
            except Exception as dump_error:  # the error itself is still told
                message += f" (no memory snapshot: {first_line(dump_error)})"
        message = message if rank is None else f"rank {rank}: {message}"
        record_error(run_dir, {"type": type(exc).__name__, "message": message}, ready_at)
        traceback.print_exc()
        return 1
    # Rank 0 writes the run's summary (it holds every rank's step times); other ranks only train.
    if int(os.environ.get("RANK", 0)) == 0:
        # setup_at: when the backend began its setup, its imports done (startup as the job counts it).
        summary.timing.update(ready_at=ready_at, import_s=summary.timing["setup_at"] - ready_at)
        if sampler is not None:
            try:
                metrics, info = system_summary(sampler, summary.metrics, summary.timing)
            except Exception as exc:  # what training measured is saved whatever the samples hold
                metrics, info = {}, {"system_metrics": f"not summarised: {type(exc).__name__}: {first_line(exc)}"}
            summary.metrics.update(metrics)
            summary.info.update(info)
        summary.save(run_dir)
    return 0


def exit_now(code: int) -> None:
    """End the process without the interpreter's teardown of torch and transformers (about 2 s of
    every run, spent after everything is written: the records are closed files by now). What the
    worker leaves running (Inductor's compile pool, which can take seconds to stop while it is still
    starting) the job ends with the worker's process group (launch/worker_process.run_worker). A
    CUDA tool injected into the process (nsys, ncu: CUDA_INJECTION64_PATH) flushes its data in the
    normal exit, so under one the worker exits normally."""
    if os.environ.get("CUDA_INJECTION64_PATH"):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv))
