"""What a GPU run's memory did: the CUDA caching allocator's history over the first steps, dumped as
memory_snapshot.pickle when the run runs out of memory (open it in https://pytorch.org/memory_viz),
and the out-of-memory error in one line.

Recording stops after HISTORY_STEPS steps: it costs a stack trace per allocation, and the first
steps are warm-up steps (train.warmup_steps, at least 1) that the step time leaves out anyway; they
hold the allocations an out-of-memory error is usually about (weights, the first activations and
gradients, the optimizer's states made at the first step).
"""

from __future__ import annotations

import re
from pathlib import Path

# Steps whose allocations the history keeps.
HISTORY_STEPS = 2
# Allocation events kept at most (a ring buffer): enough for two steps of a 7B model's layers.
HISTORY_ENTRIES = 200_000
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def start_history() -> None:
    import torch

    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")


def stop_history() -> None:
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)


def oom_line(message: str, allocated: int, reserved: int, total: int) -> str:
    """One line for a CUDA out-of-memory error: what was requested (from torch's message) against the
    caching allocator's allocated and reserved bytes and the GPU's total, in GiB."""
    asked = re.search(r"[Tt]ried to allocate ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)", message)
    requested = f"{float(asked[1]) * _UNITS[asked[2]] / 2**30:.2f} GiB" if asked else "an unknown size"
    return (
        f"CUDA out of memory: requested {requested} with {allocated / 2**30:.2f} GiB allocated, "
        f"{reserved / 2**30:.2f} GiB reserved, {total / 2**30:.2f} GiB total"
    )


def is_cuda_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def on_oom(exc: BaseException, snapshot: Path) -> str:
    """The one line for `exc`, after dumping the allocator's snapshot (with the history recorded so far)."""
    import torch

    device = torch.cuda.current_device()
    torch.cuda.memory._dump_snapshot(str(snapshot))
    return oom_line(
        str(exc),
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
        torch.cuda.get_device_properties(device).total_memory,
    )
