"""Python's garbage collector in the training loop: how long its collections held the host in the
steps after the warm-up (always recorded), and `train.gc_interval`'s manual collection.

A collection of the oldest generation walks every object the worker holds (a 7B model's modules and
parameters, torch.compile's caches). The host stops for it, and a step whose GPU was waiting on the
host (offloaded activations, small kernels) runs longer by as much: a step-time spike that the
measurement then needs more steps to average out. With `train.gc_interval=N` automatic collection is
off in the loop and the young generations are collected every N steps, inside that step, so what it
costs is timed like the rest of the step (torchtitan's `gc_freq`; NeMo's GarbageCollectionCallback and
AutoModel's `gc_every_steps` are the same lever in those backends).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from types import TracebackType

# The generation `train.gc_interval` collects: the young ones. What survives them is left for the
# end of the run, as torchtitan does; a fine-tuning run's objects are made at set-up, not per step.
YOUNG = 1


@dataclass
class Pause:
    step: int  # the step the collection ran in
    generation: int
    ms: float


@dataclass
class GcPauses:
    """The collections during a worker's steps (`pauses`), and the manual collection every `interval`
    steps when one is given. Enter it before the first step; tell it each step's end with `step_done`."""

    interval: int | None = None
    pauses: list[Pause] = field(default_factory=list)
    _step: int = field(default=0, init=False)
    _started: float | None = field(default=None, init=False)

    def __enter__(self) -> GcPauses:
        if self.interval is not None:
            gc.collect()  # the set-up's garbage, before the first step rather than in a measured one
            gc.disable()
        gc.callbacks.append(self._timed)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        gc.callbacks.remove(self._timed)
        if self.interval is not None:
            gc.enable()

    def step_done(self, step: int) -> None:
        """Call at the end of `step`, before its end is timed: the manual collection falls inside it."""
        if self.interval is not None and (step + 1) % self.interval == 0:
            gc.collect(YOUNG)
        self._step = step + 1

    def metrics(self, first_measured: int) -> dict[str, float]:
        """From step `first_measured` on (the warm-up's compiling makes garbage no training step
        does): the mean pause per step, the longest one, and how many collections of the oldest
        generation ran."""
        measured = [p for p in self.pauses if p.step >= first_measured]
        steps = max(1, self._step - first_measured)
        return {
            "gc_pause_ms_per_step": sum(p.ms for p in measured) / steps,
            "gc_pause_max_ms": max((p.ms for p in measured), default=0.0),
            "gc_full_collections": float(sum(p.generation == 2 for p in measured)),
        }

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.pauses.append(Pause(self._step, info["generation"], (time.perf_counter() - self._started) * 1000))
            self._started = None
