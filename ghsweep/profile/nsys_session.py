"""One worker's collection in an Nsight Systems session (the pre-imported worker's `nsys launch`).

The sweep forks the next worker as soon as the last one has exited, while nsys still writes the last
report; the session takes one collection at a time. So the worker arms its own collection (`nsys
start`, the run plan's SessionCapture.start) once the session is free, in the background while it
sets up, and it ends its capture window without waiting for the report: nsys writes it in its own
process, and the worker may exit once the session is writing it (`RangeGeneration`). A worker that
exits before that leaves a broken report and holds the session for minutes
(benchmarks/nsys_late_arm.sh measured both).

The sweep names the session to the worker in GHSWEEP_NSYS_SESSION (launch.worker_process.WarmWorker).
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

SESSION_ENV = "GHSWEEP_NSYS_SESSION"
# States of `nsys sessions list`: free for a collection; writing a report.
FREE = "Launched"
WRITING = ("RangeGeneration", "RangeImportation")
# How long a report may take to be written, and a worker to wait for the session.
REPORT_TIMEOUT_S = 600
POLL_S = 0.05


def session_state(nsys: str, session: str) -> str | None:
    """The state `nsys sessions list` gives the session (Launched, StartRange, RangeCollection,
    RangeGeneration, ...), or None when there is no such session."""
    listed = subprocess.run([nsys, "sessions", "list"], capture_output=True, text=True, timeout=60).stdout
    for row in listed.splitlines():
        fields = row.split()  # ID TIME STATE LAUNCH NAME
        if len(fields) == 5 and fields[4] == session:
            return fields[2]
    return None


def wait_for_state(nsys: str, session: str, reached: Callable[[str | None], bool], timeout_s: float) -> str | None:
    """Poll the session until `reached` holds for its state, for at most `timeout_s`; the last state seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = session_state(nsys, session)
        if reached(state):
            return state
        if time.monotonic() > deadline:
            log.warning("nsys session %s: still %s after %d s", session, state, timeout_s)
            return state
        time.sleep(POLL_S)


def report_written(nsys: str, session: str) -> None:
    """Wait until the session has written the report of its last collection."""
    wait_for_state(nsys, session, lambda state: state not in WRITING, REPORT_TIMEOUT_S)


class WorkerCollection:
    """This worker's collection of the session: armed in the background from construction, its capture
    window opened by cudaProfilerStart once `armed()`, closed by `stop_without_waiting`."""

    def __init__(self, start: Sequence[str], session: str) -> None:
        self.nsys, self.session = start[0], session
        self._start = [*start, f"--session={session}"]
        self._error: str | None = None
        self._arming = threading.Thread(target=self._arm, name="nsys-arm", daemon=True)
        self._arming.start()

    @classmethod
    def of_this_worker(cls, start: Sequence[str] | None) -> WorkerCollection | None:
        """The collection of a worker the sweep forked under its session (`start`: the plan's
        SessionCapture.start); None for any other worker."""
        session = os.environ.get(SESSION_ENV)
        return cls(start, session) if session and start else None

    def _arm(self) -> None:
        # The last worker's report may still be written: the session takes the next collection after it.
        state = wait_for_state(self.nsys, self.session, lambda state: state in (FREE, None), REPORT_TIMEOUT_S)
        if state != FREE:
            why = "gone" if state is None else f"still {state} after {REPORT_TIMEOUT_S} s"
            self._error = f"nsys session {self.session}: {why}, so this run's collection cannot start"
            return
        started = subprocess.run(self._start, capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip().splitlines()
            self._error = f"nsys start failed: {said[-1] if said else started.returncode}"

    def armed(self) -> None:
        """Wait until the collection is armed; RuntimeError when it could not be."""
        self._arming.join()
        if self._error:
            raise RuntimeError(self._error)

    def stop_without_waiting(self, device_index: int) -> None:
        """End the capture window and return once nsys is writing the report (or has written it).

        cudaProfilerStop holds its caller until the report is written (seconds): it runs on a thread of
        its own (the driver's cuProfilerStop through ctypes, which lets the GIL go), in the context
        the steps ran in, and is left behind when the worker exits."""

        def stop() -> None:
            import torch

            torch.cuda.set_device(device_index)
            ctypes.CDLL("libcuda.so.1").cuProfilerStop()

        stopping = threading.Thread(target=stop, name="nsys-stop", daemon=True)
        stopping.start()
        wait_for_state(
            self.nsys,
            self.session,
            lambda state: not stopping.is_alive() or state in WRITING or state == FREE,
            REPORT_TIMEOUT_S,
        )
