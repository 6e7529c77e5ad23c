"""Ctrl-C (SIGINT) and SIGTERM of a sweep or run: both arrive as KeyboardInterrupt, so the run in
progress stops its worker and records itself KILLED, and the sweep ends with its summary.

SIGTERM is what `kill`, `timeout` and process managers send; by default it would end the process
at once and leave the worker running and the MLflow runs RUNNING.
"""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, as Ctrl-C raises KeyboardInterrupt."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def interrupt_on_signals() -> None:
    """SIGTERM raises Terminated; SIGINT raises KeyboardInterrupt even where the process started with
    it ignored (a background job of a non-interactive shell)."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def signal_of(interrupt: KeyboardInterrupt) -> signal.Signals:
    return signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT


def reason(interrupt: KeyboardInterrupt) -> str:
    sig = signal_of(interrupt)
    return f"interrupted by {sig.name}" + (" (Ctrl-C)" if sig == signal.SIGINT else "")


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for a process ended by the signal: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + signal_of(interrupt)
