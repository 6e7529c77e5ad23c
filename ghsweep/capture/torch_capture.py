"""The PyTorch profiler over the capture window (profile=torch): CPU ops, and on a GPU also the
kernels, memcpy and memset, written as a Chrome trace (the format Holistic Trace Analysis and
Perfetto read).

The training loop calls `step(n)` at the start of every step and `close()` when it ends (also when
it fails: a context manager); the profiler records steps `start_step` .. `start_step + num_steps - 1`
only (its window), because a trace of every step of a 7B model would be gigabytes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ghsweep.core.run_dir import MEMORY_SNAPSHOT, TORCH_TRACE, rank_file
from ghsweep.core.run_plan import ProfilePlan

# Allocation events kept at most over the window (a ring buffer).
MEMORY_HISTORY_ENTRIES = 1_000_000


class TorchCapture:
    def __init__(self, path: Path | None, device: torch.device, window: range | None, memory: bool = False):
        """`path` None: a no-op (the run is not profiled with the PyTorch profiler). `window`: the recorded
        steps, None until open_window gives them. `memory`: record the CUDA allocator's history over the
        window instead, dumped to `path` (profile=memory)."""
        self.path = path
        self._memory = memory
        self._window = window or range(0)
        self._activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self._activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler: torch.profiler.profile | None = None
        self._recording = False

    def __enter__(self) -> TorchCapture:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open_window(self, window: range) -> None:
        """Record `window` (from a step still to come)."""
        self._window = window

    def step(self, step: int) -> None:
        if self.path is None:
            return
        if self._window and step == self._window.start and self._profiler is None and not self._recording:
            if self._memory:
                torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES, stacks="python")
                self._recording = True
                return
            self._profiler = torch.profiler.profile(activities=self._activities)
            self._profiler.__enter__()
        elif step == self._window.stop:
            self.close()

    def close(self) -> None:
        if self._recording:
            self._recording = False
            torch.cuda.memory._dump_snapshot(str(self.path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.path = None
            return
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(str(self.path))
        self.path = None  # one window per run


def torch_capture(
    plan: ProfilePlan, run_dir: Path, device: torch.device, window: range | None, rank: int = 0
) -> TorchCapture:
    """The capture a worker runs with: active when the run's profile plan says torch (profile=torch,
    or profile=auto without nsys or GPU), a no-op otherwise. With several ranks rank 0 traces (one
    trace file per run)."""
    if plan.used == "memory":
        return TorchCapture(run_dir / rank_file(MEMORY_SNAPSHOT, rank), device, window, memory=True)
    path = run_dir / TORCH_TRACE if plan.used == "torch" and rank == 0 else None
    return TorchCapture(path, device, window)
