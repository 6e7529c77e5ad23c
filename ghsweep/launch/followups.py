"""What follows each worker of a local sweep, while the next combination starts.

On the default launcher (one combination after another, in the sweep's process) a job returns as
soon as its worker has exited; its follow-up (the profile's export and analysis, its report and
plots, the MLflow record) runs on one thread of the sweep, in job order, while the next worker
starts, sets up and compiles. That worker waits before its first step that may be measured until
every follow-up before it is done (RunPlan.measure_after), so none of them runs beside a
measurement. The launcher waits for the last follow-up before it returns, and on an interrupt too:
every run that ended is recorded before the sweep stops.

Elsewhere (a single run, a launcher that runs jobs in other processes) a follow-up runs at once.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)


class FollowUps:
    """One thread that runs the follow-ups it is given, in order."""

    def __init__(self) -> None:
        self._todo: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ghsweep-followups", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (followup := self._todo.get()) is not None:
            try:
                followup()
            except Exception:  # a follow-up records its own failures; one that raises must not stop the rest
                log.exception("a run's follow-up failed")
            finally:
                self._todo.task_done()
        self._todo.task_done()

    def submit(self, followup: Callable[[], None]) -> None:
        self._todo.put(followup)

    def mark_when_done(self, path: Path) -> None:
        """Make `path` once every follow-up submitted so far has run."""
        self.submit(lambda: _mark(path))

    def join(self) -> None:
        """Wait until every follow-up submitted so far has run."""
        self._todo.join()

    def close(self) -> None:
        self.join()
        self._todo.put(None)
        self._thread.join()


def _mark(path: Path) -> None:
    try:
        path.touch()
    except OSError as exc:  # its run directory removed or full: the worker finds that out for itself
        log.error("%s: not made (%s)", path, exc)


_active: FollowUps | None = None


@contextlib.contextmanager
def overlapped() -> Iterator[None]:
    """Within: follow-ups run on the sweep's follow-up thread (the launcher's launch()); each is done
    when it ends, however it ends."""
    global _active
    _active = FollowUps()
    try:
        yield
    finally:
        followups, _active = _active, None
        followups.close()


def run(followup: Callable[[], None], alone: bool = False) -> None:
    """Run `followup` on the sweep's follow-up thread where one is active, else now. `alone`: it
    must run beside no training (an ncu pass, which trains on the GPU): now, after those before it."""
    if _active is None:
        followup()
    elif alone:
        _active.join()
        followup()
    else:
        _active.submit(followup)


def measure_after(path: Path) -> Path | None:
    """`path`, to be made once the follow-ups before this run are done (RunPlan.measure_after); None
    where none run beside it."""
    if _active is None:
        return None
    path.unlink(missing_ok=True)
    _active.mark_when_done(path)
    return path


# Follow-ups that train on the GPU beside the runs (compile-ahead workers): how many run now and when
# the last ended. A run that ran out of GPU memory while they ran is run again once they have ended
# (job.train_with_retries), as the sweep, not the combination, took that memory.
_gpu_use = threading.Condition()
_on_gpu = 0
_gpu_last_used = 0.0


@contextlib.contextmanager
def on_the_gpu() -> Iterator[None]:
    """Within: a follow-up trains on the GPU the runs use."""
    global _on_gpu, _gpu_last_used
    with _gpu_use:
        _on_gpu += 1
    try:
        yield
    finally:
        with _gpu_use:
            _on_gpu -= 1
            _gpu_last_used = time.time()
            _gpu_use.notify_all()


def gpu_shared_since(started: float) -> bool:
    """Whether a follow-up trained on the GPU at any time since `started` (time.time())."""
    with _gpu_use:
        return _on_gpu > 0 or _gpu_last_used >= started


def wait_for_gpu() -> None:
    """Return once no follow-up trains on the GPU."""
    with _gpu_use:
        _gpu_use.wait_for(lambda: _on_gpu == 0)
