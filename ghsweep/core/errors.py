"""The exceptions every stage raises and catches, and how one is told in one line.

Each is a plain subclass of a builtin, so a caller that only knows the builtin (ValueError for bad
input, LookupError for a missing record) still catches it. Nothing here imports the rest of ghsweep.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value this run cannot use."""


class TuneConfigError(ValueError):
    """A `tune.*` value the study cannot use."""


class SpaceError(ValueError):
    """An override the search space cannot take."""


class ProfilerUnavailable(RuntimeError):
    """A profiler the config asks for cannot run here."""


class ProfileError(ValueError):
    """A profile that cannot be analysed; the message is one line naming the file."""


class BaselineError(ValueError):
    """report.baseline names no combination of the sweep."""


class SweepNotFound(LookupError):
    """The name or id given does not lead to a run of the kind asked for."""


class GateError(ValueError):
    """A sweep or reference the gate cannot compare."""


class TrackingUriError(ValueError):
    """A tracking URI that cannot work: an unknown scheme, or no server where it points."""


class TrackingError(RuntimeError):
    """The tracking store refused a request (not a busy moment: those are retried); one line."""


class NonFiniteLoss(ArithmeticError):
    """A training step's loss was NaN or infinite: the run diverged (or overflowed in fp16/fp8)."""


class JobTimeout(Exception):
    """Raised inside a job when SLURM signals its time limit and the run is not requeued."""


class SweepDirError(Exception):
    """The sweep directory cannot take this sweep."""


class SweepDirInUse(SweepDirError):
    """The sweep directory already belongs to another sweep."""


class SweepDirUnwritable(SweepDirError):
    """The sweep directory cannot be made or written."""


def first_line(exc: BaseException) -> str:
    """The message's first line. Where it ends in a colon, the next line too: an exception that wraps
    another says whose it is there (torch.compile's "backend='inductor' raised:") and the cause after."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def one_line(exc: BaseException) -> str:
    """`TypeName: first line of the message`."""
    return f"{type(exc).__name__}: {first_line(exc)}"
