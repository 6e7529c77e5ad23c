"""Start the worker process of a run, keep its log, and stop it if it hangs.

A worker starts as a fresh interpreter (its command), or, for a sweep that runs its combinations one
after another in its own process, forked from the pre-imported worker (ghsweep.launch.warm_worker_client),
which saves each combination the imports of torch, transformers and peft."""

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
from typing import Literal, Protocol

from ghsweep.config.schema import GPU_TIMEOUT_MIN
from ghsweep.core.atomic import open_new, write_atomic
from ghsweep.core.names import STEP_RANGE_PREFIX
from ghsweep.core.run_dir import WORKER_LOG, WORKER_PID, rank_file
from ghsweep.core.run_plan import SessionCapture
from ghsweep.launch.warm_worker_client import ForkedWorker, fork_worker, worker_env

log = logging.getLogger(__name__)


def worker_timeout_min(value: float | Literal["auto"] | None, on_gpu: bool) -> float | None:
    """worker.timeout_min (validated) as minutes, None for no limit."""
    if value == "auto":
        return GPU_TIMEOUT_MIN if on_gpu else None
    return None if value is None else float(value)


@dataclass(frozen=True)
class WorkerExit:
    returncode: int
    timed_out: bool
    started_at: float
    wall_s: float


def worker_command(
    run_dir: Path, container: Sequence[str], python: str, profiler: Sequence[str] = (), local_ranks: int = 1
) -> list[str]:
    """The argument list that starts the worker of `run_dir` with `python`, in `container` (its
    `exec ... IMAGE`, [] on the node), under `profiler` (the profiler's command up to the program:
    ghsweep.capture.profiler_plan.profiler_prefix for nsys), as `local_ranks` ranks on this machine
    (torchrun when more than one). Built by ghsweep.launch.run_planner, once, into the RunPlan.

    Always an argument list, never a shell string: user values are never parsed by a shell.
    Wrappers nest outside-in: [torchrun ... --no-python] [container exec ...] [profiler ...]
    python -m ghsweep.train.worker RUN_DIR, as srun starts a SLURM task's: each rank is its own
    container process (the rank's environment passes in), and the profiler runs inside the
    container, where the worker's CUDA libraries are, one report per rank.
    """
    return [*torchrun_prefix(sys.executable, local_ranks), *container, *profiler, *worker_program(run_dir, python)]


def torchrun_prefix(python: str, local_ranks: int) -> list[str]:
    """`python -m torch.distributed.run ... --no-python` that starts `local_ranks` ranks of the
    program that follows it on this machine; [] for one (the worker runs as it is).
    --no-python: the program is a full command line, so a profiler can wrap each rank."""
    if local_ranks == 1:
        return []
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={local_ranks}", "--no-python"]


def worker_program(run_dir: Path, python: str) -> list[str]:
    """`python -m ghsweep.train.worker RUN_DIR`: the worker itself, inside whatever wraps it."""
    return [python, "-m", "ghsweep.train.worker", str(run_dir)]


def process_start(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat); with the pid it names
    one process, where a pid alone may since name another. None when there is no such process.
    Not psutil's create_time(): that adds the boot time as the system clock now puts it, so a stored
    value stops matching its live process once the clock is set; the ticks never change."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name in parentheses may hold spaces


def worker_pid(run_dir: Path, rank: int = 0) -> int:
    """The pid of the run's worker (the first line of worker.pid; the second is its start time)."""
    return int((run_dir / rank_file(WORKER_PID, rank)).read_text().split()[0])


def stop_orphaned_worker(run_dir: Path) -> bool:
    """Kill the process group of a worker whose sweep process died (run on the run's host). The pid is
    checked to still be that run's worker: the process started when the pid file says it did."""
    try:
        pid, started = (run_dir / WORKER_PID).read_text().split()
    except (OSError, ValueError):
        return False
    if process_start(int(pid)) != started:
        return False
    os.killpg(int(pid), signal.SIGKILL)
    return True


class WorkerProcess(Protocol):
    """A started worker, as subprocess.Popen or a ForkedWorker."""

    pid: int

    def wait(self) -> int: ...


def start_worker(
    command: list[str],
    run_dir: Path,
    env: dict[str, str],
    output_fd: int,
    preimported: bool,
    capture: SessionCapture | None = None,
) -> WorkerProcess:
    """The worker of `run_dir` in its own process group, writing to `output_fd`: forked from this
    process's pre-imported worker where `preimported` allows it (RunPlan.preimported) and one serves
    (fork_worker, recorded as `capture` says), else started from `command`."""
    forked = fork_worker(run_dir, env, output_fd, capture) if preimported else None
    if forked is not None:
        return forked
    return subprocess.Popen(command, stdout=output_fd, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def run_worker(
    command: list[str],
    run_dir: Path,
    timeout_s: float | None,
    rank: int = 0,
    env: dict[str, str] | None = None,
    preimported: bool = False,
    capture: SessionCapture | None = None,
    progress: bool = True,
) -> WorkerExit:
    """Run the worker (start_worker), its output in worker.log (a SLURM task of rank N > 0:
    worker.rankN.log), with `env` added to this process's environment (container_env), its step lines
    on the console where `progress`. A handed collection's report may still be being written when this
    returns: warm_worker_client.wait_for_report."""
    env = worker_env(env)
    started_at = time.time()
    read_end, write_end = os.pipe()
    # Line-buffered: `tail -f worker.log` follows the run as it trains.
    with (
        open_new(run_dir / rank_file(WORKER_LOG, rank)) as log_file,
        open(read_end, encoding="utf-8", errors="replace") as output,
    ):
        try:
            # Own process group: a timeout kills the worker and its data-loader processes together.
            proc = start_worker(command, run_dir, env, write_end, preimported, capture)
        finally:
            os.close(write_end)  # the worker holds its own copy: its exit ends the output
        write_atomic(run_dir / rank_file(WORKER_PID, rank), f"{proc.pid}\n{process_start(proc.pid)}\n", mode=0o644)
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            os.killpg(proc.pid, signal.SIGKILL)

        def copy_output() -> None:
            writable = True
            for line in output:  # read to the end whatever becomes of the log: a worker blocks on a full pipe
                if writable:
                    try:
                        log_file.write(line)
                    except OSError as exc:  # a full or read-only disk: the run's reason says so
                        log.error("%s: the rest of the worker's output is not kept (%s)", log_file.name, exc)
                        writable = False
                if progress and line.startswith(STEP_RANGE_PREFIX):  # progress on the console; all of it in the log
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
                if isinstance(proc, ForkedWorker):
                    proc.wait_for_report_before_kill()
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            reader.join()
    return WorkerExit(returncode, timed_out.is_set(), started_at, time.time() - started_at)
