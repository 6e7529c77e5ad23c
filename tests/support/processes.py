"""Which processes are still running."""

from __future__ import annotations

from pathlib import Path


def live_group_members(pgid: int) -> list[int]:
    """The pids of process group `pgid` that still run. A killed process stays a zombie until its new
    parent (init, or whatever stands in for it in a container) reaps it; it runs nothing."""
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
