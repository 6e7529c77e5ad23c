"""A Lightning callback that measures NeMo's training steps as the torch backend measures its own.

It writes the same metrics.jsonl rows through the same StepLog, prints the same progress lines and
wraps every step in the same "step N" NVTX range, so MLflow and the profile analysis cannot tell
the backends apart.
"""

from __future__ import annotations

import contextlib
import time

import torch
from lightning.pytorch.callbacks.callback import Callback

from ghsweep.core.names import STEP_RANGE_PREFIX
from ghsweep.train.phases import Phases
from ghsweep.train.step_log import Mark, StepLog


class StepMetricsCallback(Callback):
    def __init__(self, metrics_path: str, tokens_per_step: int, max_steps: int, log_every: int):
        self.metrics_path = metrics_path
        self.tokens_per_step = tokens_per_step
        self.max_steps = max_steps
        self.log_every = log_every
        self.log: StepLog | None = None
        self._phases: Phases | None = None
        self._step = contextlib.ExitStack()
        self._started: Mark | None = None
        # Counted here rather than read from trainer.global_step, whose increment point depends on
        # the strategy's optimisation mode.
        self._steps_done = 0
        self.params_total = 0
        self.params_trainable = 0
        self.train_started_at = 0.0
        self.train_ended_at = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.train_started_at = time.time()
        device = trainer.strategy.root_device
        # After the PEFT transform: the frozen base and the adapters as they train.
        self.params_total = sum(p.numel() for p in pl_module.parameters())
        self.params_trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        # Rank 0 writes the run's metrics.jsonl; the other ranks (one per GPU) only measure.
        self.log = StepLog(self.metrics_path if trainer.global_rank == 0 else None, device, self.tokens_per_step)
        # Ranges only: NsysCallback owns the capture window.
        self._phases = Phases(device, range(0))

    def _require_log(self) -> StepLog:
        if self.log is None:
            raise RuntimeError("a training hook ran before on_train_start")
        return self.log

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self._phases is None:
            raise RuntimeError("a training hook ran before on_train_start")
        self._step.enter_context(self._phases.range(f"{STEP_RANGE_PREFIX}{self._steps_done}"))
        self._started = self._require_log().start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._started is None:
            raise RuntimeError("on_train_batch_end ran without on_train_batch_start")
        log = self._require_log()
        step = self._steps_done
        self._steps_done += 1
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        log.end(step, torch.as_tensor(loss), self._started)
        self._step.close()
        log.flush_due(step + 1, self.max_steps, self.log_every, progress=trainer.global_rank == 0)

    def on_train_end(self, trainer, pl_module) -> None:
        self._require_log().close()
        self.train_ended_at = time.time()
