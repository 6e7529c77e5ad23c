"""Why a run failed, in two classes: its combination (deterministic) or the machine it ran on
(infrastructure). Only an infrastructure failure is worth running again.

The class is read from the run's one-line error (ghsweep.error) and the end of its worker log, so a
job, the SLURM settling of a lost job and a tuning study all judge a failure the same way.
Anything not recognised as infrastructure is deterministic: running a combination again costs a
whole run, and a failure nobody recognised is far more often the combination's.
"""

from __future__ import annotations

import re

DETERMINISTIC = "deterministic"
INFRASTRUCTURE = "infrastructure"

_OUT_OF_MEMORY = r"CUDA out of memory|OutOfMemoryError"
# The combination's own doing, whatever else the log says (an OOM often ends in an NCCL abort of the other ranks).
_DETERMINISTIC = re.compile(rf"{_OUT_OF_MEMORY}|loss became (nan|inf|-inf) at step|ConfigError", re.IGNORECASE)
# The machine's doing: the node or the job lost, the network between ranks, the GPU's hardware.
_INFRASTRUCTURE = re.compile(
    r"PREEMPTED|NODE_FAIL|BOOT_FAIL"
    r"|NCCL[^\n]*(time[d ]?out|watchdog|communicator|remote error|system error|unhandled system)"
    r"|nccl(Internal|System|Remote)Error|ProcessGroupNCCL[^\n]*(timeout|abort)"
    r"|Watchdog caught collective operation timeout|remote process exited or there was a network error"
    r"|uncorrectable ECC error|ECC error|\bXid\b|GPU has fallen off the bus|lost its node",
    re.IGNORECASE,
)
# Signals a process raises on itself (a bad memory access, an abort, a bad instruction): the program's fault.
_SELF_SENT = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP")
_KILLED_BY = re.compile(r"\bworker killed by (SIG[A-Z0-9]+)")


def failure_class(error: str, log_tail: str = "") -> str:
    """DETERMINISTIC or INFRASTRUCTURE for a run that failed with `error` (its one-line reason),
    its worker log ending with `log_tail`."""
    if _DETERMINISTIC.search(error):
        return DETERMINISTIC
    if _INFRASTRUCTURE.search(error) or _INFRASTRUCTURE.search(log_tail):
        return INFRASTRUCTURE
    killed = _KILLED_BY.search(error)
    # A worker killed by a signal it did not send itself: the node's doing (ghsweep's own kill at
    # worker.timeout_min says "timed out", not this).
    if killed and killed.group(1) not in _SELF_SENT:
        return INFRASTRUCTURE
    return DETERMINISTIC


def out_of_memory(error: str) -> bool:
    """Whether a run failed with `error` (its one-line reason) because its GPU's memory ran out."""
    return re.search(_OUT_OF_MEMORY, error, re.IGNORECASE) is not None
