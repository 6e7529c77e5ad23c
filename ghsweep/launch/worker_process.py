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

from ghsweep.launch.container import container_prefix

log = logging.getLogger(__name__)

WORKER_LOG = "worker.log"
# Lines of the worker's output shown on the console as progress (the full output goes to the log).
PROGRESS_PREFIX = "step "


@dataclass(frozen=True)
class WorkerExit:
    returncode: int
    timed_out: bool
    started_at: float
    wall_s: float


def worker_command(cfg: DictConfig, run_dir: Path, profiler: Sequence[str] = ()) -> list[str]:
    """The argument list that starts the worker of `run_dir`, under `profiler` (the profiler's
    command up to the program: ghsweep.profile.plan.profiler_prefix for nsys, the ncu pass's).

    Always an argument list, never a shell string: user values are never parsed by a shell.
    Wrappers nest outside-in: [container exec ...] [profiler ...] python -m ghsweep.train.worker RUN_DIR;
    the profiler runs inside the container, where the worker's CUDA libraries are.
    """
    container = container_prefix(cfg, run_dir)
    # Inside a container the image's Python runs the worker: the host interpreter's path means nothing there.
    python = cfg.container.python if container else sys.executable
    return [*container, *profiler, python, "-m", "ghsweep.train.worker", str(run_dir)]


def run_worker(command: list[str], run_dir: Path, timeout_s: float | None) -> WorkerExit:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started_at = time.time()
    with open(run_dir / WORKER_LOG, "w", encoding="utf-8") as log_file:
        # Own process group: a timeout kills the worker and its data-loader processes together.
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True,
        )
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill_on_timeout) if timeout_s else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:
                log_file.write(line)
                if line.startswith(PROGRESS_PREFIX):
                    log.info("  %s", line.rstrip())
            returncode = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return WorkerExit(returncode, timed_out.is_set(), started_at, time.time() - started_at)
