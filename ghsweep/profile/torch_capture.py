"""The PyTorch profiler over the capture window (profile=torch): CPU ops, and on a GPU also the
kernels, memcpy and memset, written as a Chrome trace (the format Holistic Trace Analysis and
Perfetto read).

The training loop calls `step(n)` at the start of every step and `close()` when it ends (also when
it fails: a context manager); the profiler records steps `start_step` .. `start_step + num_steps - 1`
only, because a trace of every step of a 7B model would be gigabytes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ghsweep.core.run_dir import TORCH_TRACE
from ghsweep.core.run_plan import ProfilePlan


class TorchCapture:
    def __init__(self, path: Path | None, device: torch.device, start_step: int, num_steps: int):
        """`path` None: a no-op (the run is not profiled with the PyTorch profiler)."""
        self.path = path
        self._window = range(start_step, start_step + num_steps)
        self._activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self._activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler: torch.profiler.profile | None = None

    def __enter__(self) -> TorchCapture:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def step(self, step: int) -> None:
        if self.path is None:
            return
        if step == self._window.start and self._profiler is None:
            self._profiler = torch.profiler.profile(activities=self._activities)
            self._profiler.__enter__()
        elif step == self._window.stop:
            self.close()

    def close(self) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(str(self.path))
        self.path = None  # one window per run


def torch_capture(
    plan: ProfilePlan, run_dir: Path, device: torch.device, start_step: int, num_steps: int, rank: int = 0
) -> TorchCapture:
    """The capture a worker runs with: active when the run's profile plan says torch (profile=torch,
    or profile=auto without nsys or GPU), a no-op otherwise. With several ranks rank 0 traces (one
    trace file per run)."""
    path = run_dir / TORCH_TRACE if plan.used == "torch" and rank == 0 else None
    return TorchCapture(path, device, start_step, num_steps)
