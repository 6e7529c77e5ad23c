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
import time
from collections.abc import Iterator

import torch

from ghsweep.core.names import STEP_RANGE_PREFIX


class Phases:
    def __init__(self, device: torch.device, window: range | None):
        """`window`: the captured steps; None until open_window gives them."""
        self._nvtx = device.type == "cuda"
        self._capture = window or range(0)
        self._capturing = False
        # Seconds the capture window's edges held the loop: under an nsys session the report is
        # written inside cudaProfilerStop, before the worker trains on.
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
        if self._nvtx and self._capture and step == self._capture.start and not self._capturing:
            started = time.perf_counter()
            torch.cuda.cudart().cudaProfilerStart()
            self.capture_s += time.perf_counter() - started
            self._capturing = True
        if step == self._capture.stop:
            self.close()
        return self.range(f"{STEP_RANGE_PREFIX}{step}")

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._capturing:
            torch.cuda.synchronize()
            started = time.perf_counter()
            torch.cuda.cudart().cudaProfilerStop()
            self.capture_s += time.perf_counter() - started
            self._capturing = False
