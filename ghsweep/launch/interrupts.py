"""Ctrl-C (SIGINT) and SIGTERM of a sweep or run: both arrive as KeyboardInterrupt, so the run in
progress stops its worker and records itself KILLED, and the sweep ends with its summary.

SIGTERM is what `kill`, `timeout` and process managers send; by default it would end the process
at once and leave the worker running and the MLflow runs RUNNING. Only the first signal interrupts:
a second Ctrl-C while the sweep records what finished would break that record off and leave its runs
RUNNING, so it is answered with a line saying so.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, as Ctrl-C raises KeyboardInterrupt."""


_stopping = False


def _interrupt(signum: int, frame: object) -> None:
    global _stopping
    if _stopping:
        print(
            f"ghsweep: {signal.Signals(signum).name} again: already stopping; recording what finished first",
            file=sys.stderr,
            flush=True,
        )
        return
    _stopping = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def interrupt_on_signals() -> None:
    """SIGTERM raises Terminated; SIGINT raises KeyboardInterrupt even where the process started with
    it ignored (a background job of a non-interactive shell). Once."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)


def signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    return signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT


def reason(interrupt: KeyboardInterrupt) -> str:
    sig = signal_of(interrupt)
    return f"interrupted by {sig.name}" + (" (Ctrl-C)" if sig == signal.SIGINT else "")


def exit_interrupted(interrupt: KeyboardInterrupt) -> NoReturn:
    """Exit with the shell's status for a process ended by the signal: 130 for SIGINT, 143 for SIGTERM.

    Everything is recorded by now. The interpreter's teardown puts back the default action of
    signals that have a Python handler, so a further Ctrl-C during it would end the process by the
    signal instead (status -2); from here on they are ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(128 + signal_of(interrupt))
