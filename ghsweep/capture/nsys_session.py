"""The sweep's side of an nsys session's collections (`nsys launch` / `start` / `stop`): what state a
session is in, and the hand-off of one run's collection to and from its forked worker
(ghsweep.core.handoff says why and how the two speak).

A collection's life as `nsys sessions list` shows it, measured with the real nsys on an H200
(benchmarks/h200_nsys_late_arm.json): armed by `nsys start`; RangeCollection from the worker's
cudaProfilerStart; RangeGeneration as its stop begins (nsys now holds what it recorded); then
RangeImportation, and Launched once the report is written, 6-9 s after the stop began, ready for the
next `nsys start`. A collection armed after its worker was forked records that worker.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ghsweep.core.atomic import wait_for_file, write_atomic
from ghsweep.core.run_dir import CAPTURE_ARMED, CAPTURE_MAY_EXIT, CAPTURE_STOPPING

log = logging.getLogger(__name__)

# The session is idle (no collection, or none left: the session is gone) and can be armed again.
IDLE = ("Launched", None)
# nsys holds what the collection recorded and writes the report without the worker.
WRITING = ("RangeGeneration", "RangeImportation", *IDLE)
# How long a collection may take to write its report; how long nsys may take to begin writing it once
# the worker's stop began; how often the session is asked (each ask runs `nsys sessions list`).
REPORT_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120
POLL_S = 0.1


def session_state(nsys: str, session: str) -> str | None:
    """The state `nsys sessions list` gives the session (Launched, RangeCollection, RangeGeneration,
    ...), or None when there is no such session."""
    listed = subprocess.run([nsys, "sessions", "list"], capture_output=True, text=True, timeout=60).stdout
    for row in listed.splitlines():
        fields = row.split()  # ID TIME STATE LAUNCH NAME
        if len(fields) == 5 and fields[4] == session:
            return fields[2]
    return None


def wait_for_state(
    nsys: str, session: str, states: Sequence[str | None], timeout_s: float, give_up: threading.Event | None = None
) -> bool:
    """Wait until the session is in one of `states` (None: there is no such session); False after
    `timeout_s` or once `give_up` is set."""
    deadline = time.monotonic() + timeout_s
    while session_state(nsys, session) not in states:
        if time.monotonic() > deadline or (give_up is not None and give_up.is_set()):
            return False
        time.sleep(POLL_S)
    return True


def start_collection(nsys: str, session: str, start: Sequence[str]) -> str | None:
    """Arm the session's next collection (`start`: `nsys start ...` without the session); why nsys
    refused, or None."""
    started = subprocess.run([*start, f"--session={session}"], capture_output=True, text=True, timeout=60)
    if started.returncode == 0:
        return None
    said = (started.stderr or started.stdout).strip().splitlines()
    return f"nsys start failed: {said[-1] if said else started.returncode}"


def end_collection(nsys: str, session: str) -> None:
    """End whatever collection is left once its worker has gone and wait for its report: a worker that
    ended before its capture stopped (a crash, a timeout) left it armed or recording, and `nsys stop`
    writes what it recorded."""
    subprocess.run([nsys, "stop", f"--session={session}"], capture_output=True, timeout=60)
    if not wait_for_state(nsys, session, IDLE, REPORT_TIMEOUT_S):
        log.warning("nsys session %s: no report after %d s", session, REPORT_TIMEOUT_S)


class CollectionHandoff(threading.Thread):
    """One forked worker's collection, handed to and from it (ghsweep.core.handoff): arms it once the
    collection before it (`after`) has written its report, unless it was armed before the fork
    (`armed`); once the worker says its capture is stopping, waits for nsys to hold the report and lets
    the worker exit; then waits for the report to be written (`written`).

    The worker's end (`worker_ended`) stops the watch before its hand-off is done: the worker's side
    (ForkedWorker.wait) then ends the collection itself and sets `written`."""

    def __init__(
        self,
        nsys: str,
        session: str,
        start: Sequence[str],
        run_dir: Path,
        after: CollectionHandoff | None,
        armed: bool,
    ) -> None:
        super().__init__(name=f"nsys hand-off {run_dir.name}", daemon=True)
        self.nsys, self.session, self.start_command, self.run_dir = nsys, session, list(start), run_dir
        self.after = after
        self.armed = armed
        self.handed = threading.Event()  # the worker may exit: nsys holds its report
        self.written = threading.Event()  # the report is written (or the collection ended without one)
        self.worker_ended = threading.Event()

    def run(self) -> None:
        try:
            self._hand_off()
        except Exception:  # nsys itself failing: the worker's side ends the collection
            log.exception("nsys session %s: the hand-off of %s failed", self.session, self.run_dir)

    def _hand_off(self) -> None:
        if not self.armed:
            if self.after is not None and not self.after.written.wait(REPORT_TIMEOUT_S):
                log.warning(
                    "nsys session %s: the report before %s took over %d s", self.session, self.run_dir, REPORT_TIMEOUT_S
                )
            refused = start_collection(self.nsys, self.session, self.start_command)
            write_atomic(self.run_dir / CAPTURE_ARMED, refused or "")
            if refused:
                log.warning("%s: no nsys capture (%s)", self.run_dir.name, refused)
                return
            self.armed = True
        while wait_for_file(self.run_dir / CAPTURE_STOPPING, POLL_S) is None:
            if self.worker_ended.is_set():
                return
        stopping = time.monotonic()
        if not wait_for_state(self.nsys, self.session, WRITING, STOP_TIMEOUT_S, self.worker_ended):
            return
        self.handed.set()  # before the worker can see it may exit, and exit
        write_atomic(self.run_dir / CAPTURE_MAY_EXIT, "")
        handed_s = time.monotonic() - stopping
        if not wait_for_state(self.nsys, self.session, IDLE, REPORT_TIMEOUT_S):
            log.warning("nsys session %s: no report for %s after %d s", self.session, self.run_dir, REPORT_TIMEOUT_S)
        log.info(
            "%s: nsys held the capture %.1f s after its stop began and wrote the report %.1f s after",
            self.run_dir.name,
            handed_s,
            time.monotonic() - stopping,
        )
        self.written.set()
