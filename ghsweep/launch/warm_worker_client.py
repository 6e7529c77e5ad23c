"""The client of the pre-imported worker (ghsweep.train.warm_worker): for a sweep that runs its
combinations one after another in its own process, a worker that has made the imports of torch,
transformers and peft once, serving while the sweep runs, forks each combination's worker, which so
skips those imports. Under Nsight Systems it runs in an nsys session of its own, and each forked
worker is recorded by one collection of it (ghsweep.core.handoff)."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from ghsweep.capture.nsys_session import REPORT_TIMEOUT_S, CollectionHandoff, end_collection, start_collection
from ghsweep.capture.profiler_plan import sweep_session_launch
from ghsweep.config.schema import ProfileSchema, typed_section
from ghsweep.core.atomic import write_atomic
from ghsweep.core.handoff import HANDOFF_ENV
from ghsweep.core.run_dir import CAPTURE_ARMED, CAPTURE_MAY_EXIT, CAPTURE_STOPPING
from ghsweep.core.run_plan import SessionCapture
from ghsweep.launch.bytecode_cache import keep_bytecode
from ghsweep.launch.local_gpus import ONE_AT_A_TIME_LAUNCHER
from ghsweep.launch.provenance import hand_code_version_to_jobs
from ghsweep.train import warm_worker

log = logging.getLogger(__name__)


def worker_env(added: dict[str, str] | None = None) -> dict[str, str]:
    """A worker's environment: this process's, unbuffered (`tail -f worker.log` follows the run as it
    trains), with `added` (container_env). The pre-imported worker makes its imports in it, so that a
    worker it forks has the environment a worker started from its command would."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **(added or {}))


def running_group_members(pgid: int) -> list[int]:
    """The pids of process group `pgid` that still run: not those that ended and wait, as zombies, to
    be reaped by their new parent (init, or what stands in for it in a container, which may never)."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue  # the process ended while it was read
    return members


class WarmWorkerUnavailable(RuntimeError):
    """The pre-imported worker cannot fork workers: it exited, or it refused (`refused`: its imports
    initialised CUDA, as torchao's do on a machine with a GPU, or failed)."""

    def __init__(self, reason: str, refused: bool = False) -> None:
        super().__init__(reason)
        self.refused = refused


class WarmWorker:
    """A pre-imported worker (ghsweep.train.warm_worker) and the socket to ask it for workers. Its
    imports start at once and overlap the sweep's own start; it forks one worker at a time.

    Under Nsight Systems (`launch`: a SessionCapture's `nsys launch ...`) it runs in an nsys session of
    its own, which traces the workers it forks, and each worker is recorded by one collection of that
    session (the `start` it is forked with, ended by the worker's cudaProfilerStop). A collection
    handed to its worker (fork's `handoff`) lets the worker exit while nsys writes its report, and the
    next worker start meanwhile (ghsweep.core.handoff)."""

    def __init__(self, env: dict[str, str], launch: Sequence[str] = ()) -> None:
        self.env = env  # the environment its imports ran in, and so what a forked run must have
        self.launch = list(launch)
        self.session = f"ghsweep-{os.getpid()}-{id(self):x}" if launch else None
        under = [*launch, f"--session-new={self.session}"] if launch else []
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._process = subprocess.Popen(
                [*under, sys.executable, "-m", "ghsweep.train.warm_worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                # Its failures come back on the socket. The sweep's output is not held open by it, nor
                # by the workers it forks, which outlive a sweep killed outright until they are stopped.
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C is the sweep's to handle; this ends with its socket
            )
        self._ready = False
        self._started = time.monotonic()
        # The handed collections whose reports may still be being written, by run directory.
        self._handoffs: dict[Path, CollectionHandoff] = {}

    def wait_until_ready(self) -> None:
        """Wait until the server has made its imports (at once after the first time) and log how long
        they took; WarmWorkerUnavailable when it refused."""
        if self._ready:
            return
        asked = time.monotonic()
        answer = self.receive()
        if "error" in answer:
            raise WarmWorkerUnavailable(answer["error"], refused=True)
        self._ready = True
        ready = time.monotonic()
        log.info(
            "  the pre-imported worker was ready %.1f s after it started (its imports); "
            "this combination waited %.1f s for it",
            ready - self._started,
            ready - asked,
        )

    def fork(self, run_dir: Path, output_fd: int, capture: SessionCapture | None = None) -> ForkedWorker:
        """Start the worker of `run_dir` with the server's environment, its output to `output_fd`,
        recorded by `capture`'s collection (`nsys start ...` in the server's session) when one is given,
        handed to and from the worker where `capture.handoff` says so: armed once the report before it
        is written, if that is still being written now."""
        self.wait_until_ready()
        watch = None
        if capture:
            assert self.session is not None
            nsys, start, handoff = self.launch[0], capture.start, capture.handoff
            for stale in (CAPTURE_ARMED, CAPTURE_STOPPING, CAPTURE_MAY_EXIT):
                (run_dir / stale).unlink(missing_ok=True)
            # Kept until written, whoever waited for them: the next collection is armed only after.
            self._handoffs = {d: h for d, h in self._handoffs.items() if not h.written.is_set()}
            writing = list(self._handoffs.values())
            armed = not (handoff and writing)
            if armed:  # now, before the fork: a refusal leaves this run to its command
                for earlier in writing:
                    earlier.written.wait(REPORT_TIMEOUT_S)
                refused = start_collection(nsys, self.session, start)
                if refused:
                    raise WarmWorkerUnavailable(refused)
                write_atomic(run_dir / CAPTURE_ARMED, "")
            if handoff:
                watch = CollectionHandoff(nsys, self.session, start, run_dir, writing[-1] if writing else None, armed)
        request = {"run_dir": str(run_dir), "cwd": os.getcwd(), "env": {HANDOFF_ENV: "1"} if watch else {}}
        warm_worker.send(self._sock, request, [output_fd])
        forked = ForkedWorker(self.receive()["pid"], self, recorded=capture is not None, handoff=watch)
        if watch:
            self._handoffs[run_dir] = watch
            watch.start()
        return forked

    def end_collection(self) -> None:
        """Once a recorded worker has ended without handing its collection back, end it and wait for its report."""
        assert self.session is not None
        end_collection(self.launch[0], self.session)

    def report_written(self, run_dir: Path) -> None:
        """Wait until the report of `run_dir`'s handed collection is written (at once for any other run)."""
        watch = self._handoffs.get(run_dir)
        if watch is not None and not watch.written.wait(REPORT_TIMEOUT_S):
            log.warning("%s: nsys wrote no report in %d s", run_dir.name, REPORT_TIMEOUT_S)

    def receive(self) -> dict:
        """The server's next answer; WarmWorkerUnavailable when it has exited."""
        message, _ = warm_worker.receive(self._sock)
        if message is None:
            raise WarmWorkerUnavailable(f"the pre-imported worker exited (exit code {self._process.wait()})")
        return message

    def close(self) -> None:
        # nsys, where the server runs under it, leaves with the server, in the group it leads: not
        # before the reports it is writing are written.
        for run_dir in self._handoffs:
            self.report_written(run_dir)
        self._sock.close()
        if not self._ready:  # it may still be importing, and would only find the socket closed then
            self._kill()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
            self._process.wait()

    def _kill(self) -> None:
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkedWorker:
    """A worker a WarmWorker forked: not this process's child, so its exit code comes from the server."""

    def __init__(
        self, pid: int, server: WarmWorker, recorded: bool = False, handoff: CollectionHandoff | None = None
    ) -> None:
        self.pid = pid
        self._server = server
        self._recorded = recorded
        self._handoff = handoff
        self._returncode: int | None = None

    def wait(self) -> int:
        if self._returncode is None:
            try:
                self._returncode = int(self._server.receive()["returncode"])
            except WarmWorkerUnavailable as exc:
                # Its worker, in a session of its own, may outlive it: run_worker kills the group.
                log.error("worker %d: %s; its exit code is lost", self.pid, exc)
                self._returncode = -signal.SIGKILL
            if self._recorded:
                self._end_collection()
        return self._returncode

    def wait_for_report_before_kill(self) -> None:
        """Before the job kills what this worker left running (run_worker): where it handed its
        collection over, wait until nsys has written its report or those processes have ended. Killed
        while nsys writes, they hold the report for about 30 s (docs/sweep-time.md: "Forked workers under Nsight
        Systems"): a process of the user's, or anything else the worker did not end. A worker that
        left nothing running, the usual case, is not waited for: the next one starts at once."""
        watch = self._handoff
        if watch is None or not watch.handed.is_set() or not running_group_members(self.pid):
            return
        started = time.monotonic()
        while not watch.written.wait(0.1) and running_group_members(self.pid):
            if time.monotonic() - started > REPORT_TIMEOUT_S:
                break
        log.info(
            "  the worker left processes running; %s %.1f s after its exit",
            "nsys had written its report" if watch.written.is_set() else "they had ended",
            time.monotonic() - started,
        )

    def _end_collection(self) -> None:
        """A handed collection goes on being written after its worker; any other is ended here."""
        watch = self._handoff
        if watch is None:
            self._server.end_collection()
            return
        watch.worker_ended.set()
        if not watch.handed.is_set():  # it ended before it handed the collection back: a crash, a timeout
            watch.join()
            self._server.end_collection()
            watch.written.set()


# The pre-imported worker of this process, while a sweep runs its combinations here one after another.
_warm: WarmWorker | None = None


def start_warm_worker(launch: Sequence[str] = ()) -> None:
    """Start this process's pre-imported worker, under `launch` (a SessionCapture's) when given
    (stopped by stop_warm_worker or this process's exit)."""
    global _warm
    if _warm is None:
        _warm = WarmWorker(worker_env(), launch)
        atexit.register(stop_warm_worker)


def stop_warm_worker() -> None:
    global _warm
    if _warm is not None:
        _warm.close()
        _warm = None


class PreimportedWorkerCallback(Callback):
    """Starts the sweep's pre-imported worker as Hydra makes its callbacks, the earliest point that
    knows the sweep's settings: its imports then overlap the sweep's own (MLflow's, the check of each
    combination) rather than follow them. Hence its own module-light callback, listed first in
    `hydra.callbacks`, started as it is made: ghsweep.launch.callbacks' first hook checks every combination
    and opens MLflow (seconds) before it could start it. Before it starts the worker, where Python keeps
    no bytecode, it has this process and every job keep theirs in the user cache
    (`worker.bytecode_cache`, launch.bytecode_cache): the worker's imports are what the first waits for.

    It serves a sweep whose combinations run one after another in this process (the default launcher),
    with `worker.preimported=true`, unless it is a dry run; under nsys when the sweep's own `profile`,
    `memory` and `device` say its runs use it here (capture.profiler_plan.sweep_session_launch). A sweep refused
    before it starts stops it with this process (atexit)."""

    def __init__(
        self,
        mode: RunMode,
        launcher: str,
        preimported: object,
        dry_run: object,
        profile: DictConfig | None = None,
        memory: str = "default",
        device: str = "cpu",
        bytecode_cache: object = True,
    ) -> None:
        if not dry_run:
            keep_bytecode(bytecode_cache is True)  # a value other than true or false is refused later, with the config
        if mode == RunMode.MULTIRUN and launcher == ONE_AT_A_TIME_LAUNCHER and preimported is True and not dry_run:
            # The jobs' environment carries the sweep's code identity (set again, the same, as the sweep
            # starts): without it here, the first job would find the environment changed and wait for
            # a second server's imports.
            hand_code_version_to_jobs()
            start_warm_worker(
                sweep_session_launch(typed_section(ProfileSchema, profile), memory, device)
                if profile is not None
                else ()
            )

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        stop_warm_worker()


def wait_for_report(run_dir: Path) -> None:
    """Wait until nsys has written the report of `run_dir`'s worker, where its collection was handed
    to it (run_worker's `handoff`) and may still be being written after it exited."""
    if _warm is not None:
        _warm.report_written(run_dir)


def fork_worker(
    run_dir: Path, env: dict[str, str], output_fd: int, capture: SessionCapture | None = None
) -> ForkedWorker | None:
    """The worker of `run_dir`, writing to `output_fd`, forked from this process's pre-imported
    worker, recorded as `capture` says (RunPlan.capture: under nsys, its collection handed to the
    worker where it says so); None where none serves or it is unavailable: the worker then starts
    from its command. A CUDA tool injected into the sweep from outside (CUDA_INJECTION64_PATH) needs
    the worker's normal exit, so its workers start from their command."""
    global _warm
    if _warm is None or "CUDA_INJECTION64_PATH" in env:
        return None
    launch = capture.launch if capture else []
    if env != _warm.env or launch != _warm.launch:
        # What torch and transformers read at import (TORCH_*, CUDA_*) must be the run's, and a
        # profiler's session is the server's.
        changed = sorted(k for k in env.keys() | _warm.env.keys() if env.get(k) != _warm.env.get(k))
        reasons = [f"environment changed ({','.join(changed)})"] if changed else []
        if launch != _warm.launch:
            reasons.append(f"profiler changed ({'an nsys session' if launch else 'none'})")
        log.info("  the worker's %s: the pre-imported worker starts again", " and ".join(reasons))
        stop_warm_worker()
        _warm = WarmWorker(env, launch)
    try:
        forked = _warm.fork(run_dir, output_fd, capture)
        log.info("  forked from the pre-imported worker (pid %d)", forked.pid)
        return forked
    except (WarmWorkerUnavailable, OSError, subprocess.SubprocessError) as exc:
        # A refusal is this machine's libraries, said once; a server that died is news.
        refused = isinstance(exc, WarmWorkerUnavailable) and exc.refused
        log.log(
            logging.INFO if refused else logging.WARNING,
            "  workers start from their command: the pre-imported worker is unavailable (%s)",
            exc,
        )
        stop_warm_worker()
        return None
