"""Which processes are still running."""

from __future__ import annotations

import time
from pathlib import Path


def live_group_members(pgid: int, grace_s: float = 10) -> list[int]:
    """The pids of process group `pgid` that still run after at most `grace_s` seconds: a process
    sent SIGKILL ends as soon as the kernel has freed its memory (a moment for a worker of gigabytes
    on a loaded machine), and stays a zombie until its new parent (init, or whatever stands in for it
    in a container) reaps it; it runs nothing."""
    deadline = time.monotonic() + grace_s
    while (members := running_group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def running_group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # Fields after the command name, which is in parentheses and may hold spaces.
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # the process ended while it was read
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members
