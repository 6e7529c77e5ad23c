"""Named ranges for each step and its phases (data, forward, backward, optimizer), and the
profiler capture window.

On a GPU the ranges are NVTX ranges (Nsight Systems shows them); everywhere they are also
`record_function` ranges (the PyTorch profiler shows them). The capture window calls
cudaProfilerStart/Stop around the configured steps, so `nsys profile --capture-range=cudaProfilerApi`
records exactly those steps.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

from ghsweep.core.atomic import wait_for_file, write_atomic
from ghsweep.core.handoff import HANDOFF_ENV
from ghsweep.core.names import STEP_RANGE_PREFIX
from ghsweep.core.run_dir import CAPTURE_ARMED, CAPTURE_MAY_EXIT, CAPTURE_STOPPING

# How long a worker waits for the sweep to arm its collection (the report before it is being written)
# and to say that nsys holds what it recorded; past these it trains without a capture, or exits anyway.
ARM_TIMEOUT_S = 600
MAY_EXIT_TIMEOUT_S = 120

T = TypeVar("T")


class HandedCollection:
    """The worker's side of an nsys collection the sweep hands to it (ghsweep.core.handoff): the
    capture starts once the sweep has armed the collection, and a capture that ends the loop stops
    without waiting for the report."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @classmethod
    def of_this_worker(cls, run_dir: Path) -> HandedCollection | None:
        """The worker's handed collection, where the sweep forked it into one (HANDOFF_ENV)."""
        return cls(run_dir) if os.environ.get(HANDOFF_ENV) else None

    def armed(self) -> bool:
        """Wait until the sweep has armed the collection; False when it could not (the capture is skipped)."""
        refused = wait_for_file(self.run_dir / CAPTURE_ARMED, ARM_TIMEOUT_S)
        if refused is None or refused:
            print(f"ghsweep: no profiler capture: {refused or f'not armed in {ARM_TIMEOUT_S} s'}", flush=True)
            return False
        return True

    def stop_on_a_thread(self) -> None:
        """Stop the capture on a thread of its own, which waits while nsys writes the report. The
        driver's cuProfilerStop lets go of the GIL (torch's cudaProfilerStop binding holds it for the
        whole write), so the worker goes on: to `stopping`, and its exit once nsys holds the report."""
        device = torch.cuda.current_device()

        def stop() -> None:
            torch.cuda.set_device(device)  # the thread's current context: the one the steps ran in
            ctypes.CDLL("libcuda.so.1").cuProfilerStop()

        threading.Thread(target=stop, name="cuProfilerStop", daemon=True).start()

    def stopping(self) -> None:
        """Tell the sweep the capture stops and wait until nsys holds the collection: a worker that
        exits before leaves a broken report."""
        write_atomic(self.run_dir / CAPTURE_STOPPING, "")
        if wait_for_file(self.run_dir / CAPTURE_MAY_EXIT, MAY_EXIT_TIMEOUT_S) is None:
            print(f"ghsweep: the sweep did not answer the capture's stop in {MAY_EXIT_TIMEOUT_S} s", flush=True)

    def end_own_processes(self) -> None:
        """End the processes this worker started that would outlive it: Inductor's compile pool (a
        sidecar and its workers), where TORCHINDUCTOR_COMPILE_THREADS asks for one under nsys
        (torch_train.compile_in_this_process). The job kills what a worker leaves behind as it exits,
        and a pool killed while nsys wrote the report held the report 35-38 s on an H200; ended here
        (in 2.3-4.6 s), 9.5-10.9 s. The data loader's processes end with its iterator as the loop
        returns, before the exit (persistent ones too, with the loader: measured on an H200). What is
        still running then, a process of the user's, the job kills once the report is written
        (ForkedWorker.wait_for_report_before_kill)."""
        async_compile = sys.modules.get("torch._inductor.async_compile")  # imported by a compile only
        if async_compile is not None:
            async_compile.shutdown_compile_workers()


class Phases:
    def __init__(self, device: torch.device, window: range | None, handed: HandedCollection | None = None):
        """`window`: the captured steps; None until open_window gives them. `handed`: the worker's
        nsys collection, where the sweep hands it over."""
        self._nvtx = device.type == "cuda"
        self._capture = window or range(0)
        self._capturing = False
        self._handed = handed
        # Seconds the capture window's edges held the loop: under an nsys session the report is
        # written inside cudaProfilerStop, before the worker trains on (unless handed over at the end).
        self.capture_s = 0.0

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        if self._nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if self._nvtx:
                torch.cuda.nvtx.range_pop()

    def open_window(self, window: builtins.range) -> None:  # `range` alone: this class's method
        """Capture `window` (from a step still to come), as the measurement that came first has stopped."""
        self._capture = window

    def step(self, step: int) -> contextlib.AbstractContextManager:
        """The range of one whole step; starts or stops the capture window at its edges."""
        if self._capture and step == self._capture.start and not self._capturing:
            self._start()
        if step == self._capture.stop:
            self._stop(steps_follow=True)
        return self.range(f"{STEP_RANGE_PREFIX}{step}")

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop(steps_follow=False)

    def _start(self) -> None:
        if self._handed and not self._timed(self._handed.armed):
            self._capture = range(0)  # no collection to record it
            return
        if self._nvtx:
            self._timed(torch.cuda.cudart().cudaProfilerStart)
        self._capturing = True

    def _stop(self, steps_follow: bool) -> None:
        """End the capture. Steps that follow would share the host with nsys writing the report (the
        tiny model's steps ran 9-46% slower beside it on an H200): they wait for it. A handed capture
        that ends the loop does not."""
        if not self._capturing:
            return
        self._capturing = False
        if self._nvtx:
            torch.cuda.synchronize()
            if self._handed and not steps_follow:
                self._timed(self._handed.stop_on_a_thread)
            else:
                self._timed(torch.cuda.cudart().cudaProfilerStop)
        if self._handed:
            self._timed(self._handed.stopping)
            if not steps_follow:
                self._timed(self._handed.end_own_processes)

    def _timed(self, edge: Callable[[], T]) -> T:
        """`edge()`, its time added to capture_s."""
        started = time.perf_counter()
        try:
            return edge()
        finally:
            self.capture_s += time.perf_counter() - started
