"""Start the worker process of a run, keep its log, and stop it if it hangs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from ghsweep.core.errors import ConfigError
from ghsweep.core.names import STEP_RANGE_PREFIX
from ghsweep.core.run_dir import WORKER_LOG, WORKER_PID, rank_file
from ghsweep.launch.container import container_prefix
from ghsweep.launch.world import torchrun_prefix

log = logging.getLogger(__name__)


# worker.timeout_min=auto on a GPU: a hang on a cluster node must not hold its allocation until the
# scheduler's limit. On CPU (smoke runs, 7B shapes on a workstation) auto sets no limit.
GPU_TIMEOUT_MIN = 60


def worker_timeout_min(value: object, on_gpu: bool) -> float | None:
    """worker.timeout_min as minutes (None: no limit): a positive number, null, or auto."""
    if value == "auto":
        return GPU_TIMEOUT_MIN if on_gpu else None
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    raise ConfigError(
        f"worker.timeout_min={value}: must be a number of minutes > 0, null (no limit) or auto "
        f"({GPU_TIMEOUT_MIN} on a GPU, no limit on CPU)"
    )


@dataclass(frozen=True)
class WorkerExit:
    returncode: int
    timed_out: bool
    started_at: float
    wall_s: float


def worker_command(cfg: DictConfig, run_dir: Path, profiler: Sequence[str] = (), local_ranks: int = 1) -> list[str]:
    """The argument list that starts the worker of `run_dir`, under `profiler` (the profiler's
    command up to the program: ghsweep.profile.plan.profiler_prefix for nsys, the ncu pass's), as
    `local_ranks` ranks on this machine (torchrun when more than one).

    Always an argument list, never a shell string: user values are never parsed by a shell.
    Wrappers nest outside-in: [torchrun ... --no-python] [container exec ...] [profiler ...]
    python -m ghsweep.train.worker RUN_DIR, as srun starts a SLURM task's: each rank is its own
    container process (the rank's environment passes in), and the profiler runs inside the
    container, where the worker's CUDA libraries are, one report per rank.
    """
    container = container_prefix(cfg, run_dir)
    # Inside a container the image's Python runs the worker: the host interpreter's path means nothing there.
    python = cfg.container.python if container else sys.executable
    return [
        *torchrun_prefix(sys.executable, local_ranks),
        *container,
        *profiler,
        python,
        "-m",
        "ghsweep.train.worker",
        str(run_dir),
    ]


def stop_orphaned_worker(run_dir: Path) -> bool:
    """Kill the process group of a worker whose sweep process died (run on the run's host). The pid
    is checked to still be that run's worker (its command line names the run directory)."""
    try:
        pid = int((run_dir / WORKER_PID).read_text())
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return False
    if str(run_dir) not in command_line.split("\0"):
        return False
    os.killpg(pid, signal.SIGKILL)
    return True


def run_worker(
    command: list[str], run_dir: Path, timeout_s: float | None, rank: int = 0, env: dict[str, str] | None = None
) -> WorkerExit:
    """Run the worker, its output in worker.log (a SLURM task of rank N > 0: worker.rankN.log), with
    `env` added to this process's environment (container_env)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    started_at = time.time()
    # Line-buffered: `tail -f worker.log` follows the run as it trains.
    with open(run_dir / rank_file(WORKER_LOG, rank), "w", encoding="utf-8", buffering=1) as log_file:
        # Own process group: a timeout kills the worker and its data-loader processes together.
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        (run_dir / rank_file(WORKER_PID, rank)).write_text(str(proc.pid))
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        def copy_output() -> None:
            assert proc.stdout is not None, "the worker was started with stdout=PIPE"
            for line in proc.stdout:
                log_file.write(line)
                if line.startswith(STEP_RANGE_PREFIX):  # progress on the console; all of it in the log
                    log.info("  %s", line.rstrip())

        reader = threading.Thread(target=copy_output, daemon=True)
        reader.start()
        timer = threading.Timer(timeout_s, kill_on_timeout) if timeout_s else None
        if timer:
            timer.start()
        try:
            returncode = proc.wait()
        finally:
            if timer:
                timer.cancel()
            # The run is over when the worker is. What it leaves running holds the log pipe open:
            # Inductor's compile pool, still starting in a short run, would keep it for seconds.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            reader.join()
    return WorkerExit(returncode, timed_out.is_set(), started_at, time.time() - started_at)
