"""Per-step measurements of a worker, written as JSON lines as they come in.

Losses and CUDA timing events stay on the device until `flush`, so logging adds no host
synchronisation to every step; the training loop flushes every `train.log_every` steps. A flush that
finds a NaN or infinite loss raises NonFiniteLoss naming the first such step: every backend's loop
writes through a StepLog, so every backend stops there.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeAlias

import torch

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.errors import NonFiniteLoss
from ghsweep.core.names import MEASURE_PRUNED, STEP_RANGE_PREFIX
from ghsweep.core.stats import StepStats, step_stats
from ghsweep.train.memory_record import HISTORY_STEPS, stop_history

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
        # When the host knew each step done (epoch s): the flush after it. Energy is measured between two.
        self.flushed_at: list[float] = []

    def start(self) -> Mark:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def end(self, step: int, loss: torch.Tensor, started: Mark) -> None:
        ended = self.start()
        self._pending.append((step, loss.detach(), started, ended))
        if self._cuda and step + 1 == HISTORY_STEPS:
            stop_history()  # the allocator's history (started by the worker) covers the first steps only

    def flush(self) -> list[dict]:
        if not self._pending:
            return []
        if self._cuda:
            torch.cuda.synchronize()
        now = time.time()
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
            self.flushed_at.append(now)
            rows.append(row)
            if not math.isfinite(row["loss"]):
                break
        if self._file:
            self._file.flush()
        self._pending.clear()
        if rows and not math.isfinite(rows[-1]["loss"]):
            # Every later step trains on garbage: end the run here rather than finish it with NaN metrics.
            # Steps count from 1 as the progress lines do (metrics.jsonl's "step" counts from 0).
            raise NonFiniteLoss(f"loss became {rows[-1]['loss']} at step {rows[-1]['step'] + 1}")
        return rows

    def flush_due(self, steps_done: int, max_steps: int, log_every: int, progress: bool) -> bool:
        """Flush every `log_every` steps and after step `max_steps`; with `progress` (rank 0), print the
        progress line the job follows the run by. True when it flushed."""
        if steps_done % log_every and steps_done != max_steps:
            return False
        self.flush()
        if progress:
            # train.measure may go on past max_steps until the step time's interval is narrow enough.
            of = f"/{max_steps}" if steps_done <= max_steps else f" (measuring past train.max_steps={max_steps})"
            print(
                f"{STEP_RANGE_PREFIX}{steps_done}{of} loss {self.losses[-1]:.4f} "
                f"step_time_ms {self.step_times_ms[-1]:.1f}",
                flush=True,
            )
        return True

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

    def stats(self, min_warmup: int, excluded: Iterable[int] = ()) -> StepStats:
        """The steady steps so far (ghsweep.core.stats): after the detected warm-up, without `excluded`."""
        return step_stats(self.step_times_ms, min_warmup, excluded)

    def steady_window(self, min_warmup: int, excluded: Iterable[int] = ()) -> tuple[float, float] | None:
        """(start, end) epoch seconds in which only steady steps ran: from the flush that saw the last
        warm-up step to the last flush; None when one flush saw both."""
        warmup = self.stats(min_warmup, excluded).warmup_steps if self.step_times_ms else 0
        if not 0 < warmup < len(self.flushed_at) or self.flushed_at[warmup - 1] >= self.flushed_at[-1]:
            return None
        return self.flushed_at[warmup - 1], self.flushed_at[-1]

    def summary(self, min_warmup: int, excluded: Iterable[int] = ()) -> dict:
        """step_time_ms, tokens_per_s and their 95% intervals over the steady steps, and the losses."""
        measured = self.stats(min_warmup, excluded).metrics(self._tokens_per_step) if self.step_times_ms else {}
        return {
            "steps": len(self.step_times_ms),
            "step_time_ms": float("nan"),
            "tokens_per_s": float("nan"),
            **measured,
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "first_loss": self.losses[0] if self.losses else float("nan"),
        }


# Why a run stopped measuring (the info `measure_stop`).
STOP_STEPS = "max_steps"  # a fixed length: train.max_steps
STOP_TARGET = "ci_target"  # the steady steps' interval reached train.measure_ci_pct
STOP_STEP_BUDGET = "step_budget"  # train.measure_max_steps spent first
STOP_TIME_BUDGET = "time_budget"  # train.measure_max_s spent first
STOP_PRUNED = MEASURE_PRUNED  # slower than a tuning study's best trial beyond the noise (tune.prune)


def measured_length(config: ConfigSchema, device_type: str) -> bool:
    """Whether train.measure decides how long the run trains (past train.max_steps), on `device_type`."""
    return config.train.measure is True or (config.train.measure == "auto" and device_type == "cuda")


@dataclass(frozen=True)
class Measure:
    """How long a run trains: `train.max_steps`, or (train.measure) on past it until the steady steps'
    95% interval of step time is within `target_ci_pct` of the median, or a budget is spent, or (a
    trial of a study with tune.prune) its tokens/s is below `prune_below` beyond the noise."""

    min_steps: int
    min_warmup: int
    excluded: range
    target_ci_pct: float | None  # None: a fixed length
    max_steps: int
    max_s: float
    prune_below: float | None = None  # tokens/s

    @classmethod
    def from_config(cls, config: ConfigSchema, device_type: str, excluded: range, prune_below: float | None) -> Measure:
        """`prune_below`: the run plan's bar (RunPlan.prune_below_tokens_per_s), which the tune sweeper sets for
        each trial: the lower end of its best finished trial's interval; None: no pruning."""
        train = config.train
        adaptive = measured_length(config, device_type)
        return cls(
            min_steps=train.max_steps,
            min_warmup=train.warmup_steps,
            excluded=excluded,
            target_ci_pct=train.measure_ci_pct if adaptive else None,
            max_steps=max(train.max_steps, train.measure_max_steps) if adaptive else train.max_steps,
            max_s=train.measure_max_s,
            prune_below=prune_below,
        )

    def stop(self, log: StepLog, steps_done: int, elapsed_s: float) -> str | None:
        """Why to stop after `steps_done` steps, all flushed to `log`; None: go on."""
        if steps_done < self.min_steps:
            return None
        if self.target_ci_pct is None:
            return STOP_STEPS
        measured = log.summary(self.min_warmup, self.excluded)
        if measured.get("step_time_ms_ci_pct", math.inf) <= self.target_ci_pct:
            return STOP_TARGET
        # Only a measurement cut short saves time: one that reached its target is a whole answer.
        if self.prune_below is not None and measured.get("tokens_per_s_ci_high", math.inf) < self.prune_below:
            return STOP_PRUNED
        if steps_done >= self.max_steps:
            return STOP_STEP_BUDGET
        if elapsed_s >= self.max_s:
            return STOP_TIME_BUDGET
        return None
