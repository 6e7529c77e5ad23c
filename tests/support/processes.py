"""Which processes are still running."""

from __future__ import annotations

import time

from ghsweep.launch.warm_worker_client import running_group_members


def live_group_members(pgid: int, grace_s: float = 10) -> list[int]:
    """The pids of process group `pgid` that still run after at most `grace_s` seconds: a process
    sent SIGKILL ends as soon as the kernel has freed its memory (a moment for a worker of gigabytes
    on a loaded machine), and stays a zombie until its new parent (init, or whatever stands in for it
    in a container) reaps it; it runs nothing."""
    deadline = time.monotonic() + grace_s
    while (members := running_group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members
