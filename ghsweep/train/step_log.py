"""Per-step measurements of a worker, written as JSON lines as they come in.

Losses and CUDA timing events stay on the device until `flush`, so logging adds no host
synchronisation to every step; the training loop flushes every `train.log_every` steps.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import IO, TypeAlias

import torch

from ghsweep.core.names import STEP_RANGE_PREFIX

# A step's start or end: a recorded CUDA timing event on a GPU, else a perf_counter reading (seconds).
Mark: TypeAlias = torch.cuda.Event | float


class StepLog:
    def __init__(self, path: str | Path | None, device: torch.device, tokens_per_step: int):
        """`path` None: measure without writing (a rank other than 0)."""
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path else None
        self._cuda = device.type == "cuda"
        self._tokens_per_step = tokens_per_step
        self._pending: list[tuple[int, torch.Tensor, Mark, Mark]] = []
        self.losses: list[float] = []
        self.step_times_ms: list[float] = []

    def start(self) -> Mark:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def end(self, step: int, loss: torch.Tensor, started: Mark) -> None:
        ended = self.start()
        self._pending.append((step, loss.detach(), started, ended))

    def flush(self) -> list[dict]:
        if not self._pending:
            return []
        if self._cuda:
            torch.cuda.synchronize()
        rows = []
        for step, loss, started, ended in self._pending:
            if isinstance(started, torch.cuda.Event) and isinstance(ended, torch.cuda.Event):  # self._cuda
                ms = started.elapsed_time(ended)
            elif isinstance(started, float) and isinstance(ended, float):
                ms = (ended - started) * 1000.0
            else:
                raise TypeError(f"a step's start and end were measured differently: {started!r}, {ended!r}")
            row = {"step": step, "loss": float(loss), "step_time_ms": ms, "tokens": self._tokens_per_step}
            if self._file:
                self._file.write(json.dumps(row) + "\n")
            self.losses.append(row["loss"])
            self.step_times_ms.append(ms)
            rows.append(row)
        if self._file:
            self._file.flush()
        self._pending.clear()
        return rows

    def flush_due(self, steps_done: int, max_steps: int, log_every: int, progress: bool) -> None:
        """Flush every `log_every` steps and after the last; with `progress` (rank 0), print the
        progress line the job follows the run by."""
        if steps_done % log_every and steps_done != max_steps:
            return
        self.flush()
        if progress:
            print(
                f"{STEP_RANGE_PREFIX}{steps_done}/{max_steps} loss {self.losses[-1]:.4f} "
                f"step_time_ms {self.step_times_ms[-1]:.1f}",
                flush=True,
            )

    def close(self) -> None:
        self.flush()
        if self._file:
            self._file.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        # After a failure the pending rows are dropped: flushing them synchronises the device,
        # which after a CUDA error raises again and would hide the error itself.
        if exc_type is None:
            self.flush()
        if self._file:
            self._file.close()

    def summary(self, warmup_steps: int) -> dict:
        """step_time_ms is the median of the steps after `warmup_steps` (all steps if too few)."""
        steady = self.step_times_ms[warmup_steps:] or self.step_times_ms
        step_ms = statistics.median(steady) if steady else float("nan")
        return {
            "steps": len(self.step_times_ms),
            "steady_steps": len(steady),
            "step_time_ms": step_ms,
            "tokens_per_s": self._tokens_per_step / (step_ms / 1000.0) if steady else float("nan"),
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "first_loss": self.losses[0] if self.losses else float("nan"),
        }
