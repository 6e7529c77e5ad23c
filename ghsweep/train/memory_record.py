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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Steps whose allocations the history keeps.
HISTORY_STEPS = 2
# Allocation events kept at most (a ring buffer): enough for two steps of a 7B model's layers.
HISTORY_ENTRIES = 200_000
# A frame in torch's own installed modules (not a folder that happens to be called torch).
TORCH_FILE = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]")
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


_recording = False


def start_history() -> None:
    global _recording
    import torch

    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
    _recording = True


def stop_history() -> None:
    """End the history start_history began; nothing where none was (memory=unified's managed-memory
    allocator, several ranks), since a pluggable allocator raises at any call to record it."""
    global _recording
    if not _recording:
        return
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)
    _recording = False


def oom_line(message: str, allocated: int, reserved: int, total: int) -> str:
    """One line for a CUDA out-of-memory error: what was requested (from torch's message) against the
    caching allocator's allocated and reserved bytes and the GPU's total, in GiB."""
    asked = re.search(r"[Tt]ried to allocate ([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)", message)
    requested = f"{float(asked[1]) * _UNITS[asked[2]] / 2**30:.2f} GiB" if asked else "an unknown size"
    return (
        f"CUDA out of memory: requested {requested} with {allocated / 2**30:.2f} GiB allocated, "
        f"{reserved / 2**30:.2f} GiB reserved, {total / 2**30:.2f} GiB total"
    )


def allocation_site(frames: list[dict]) -> str:
    """Where an allocation was made, as a person reads it: the innermost frame outside torch's own
    modules (nn.Module plumbing, torch.nn.functional), e.g. `modeling_llama.py:64 forward`."""
    for frame in frames:
        if not TORCH_FILE.search(frame["filename"]):
            return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}"
    return f"{Path(frames[0]['filename']).name}:{frames[0]['line']} {frames[0]['name']}" if frames else "unknown"


def largest_sites(snapshot: dict, top: int = 3) -> list[tuple[str, int]]:
    """The sites holding the most live memory in an allocator snapshot (torch.cuda.memory._snapshot):
    (site, bytes), largest first."""
    held: dict[str, int] = {}
    for segment in snapshot.get("segments", []):
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                site = allocation_site(block.get("frames", []))
                held[site] = held.get(site, 0) + block["size"]
    return sorted(held.items(), key=lambda item: -item[1])[:top]


def is_cuda_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def on_oom(exc: BaseException, snapshot: Path) -> str:
    """The one line for `exc`, after dumping the allocator's snapshot (with the history recorded so far)."""
    import torch

    device = torch.cuda.current_device()
    torch.cuda.memory._dump_snapshot(str(snapshot))
    line = oom_line(
        str(exc),
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
        torch.cuda.get_device_properties(device).total_memory,
    )
    return line + sites_text(largest_sites(torch.cuda.memory._snapshot()))


def sites_text(sites: list[tuple[str, int]]) -> str:
    """The end of the out-of-memory line: where the live memory was allocated."""
    held = ", ".join(f"{site} {size / 2**30:.2f} GiB" for site, size in sites)
    return f"; most memory held by {held}" if held else ""


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the tensors among `tensors` (a DTensor counts its local shard)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        if hasattr(local, "untyped_storage"):
            total += local.numel() * local.element_size()
    return total


class PeakBreakdown:
    """Where a GPU run's peak allocated memory went: parameters, gradients (one per trained
    parameter), optimizer state, activations (the most one forward pass added, read from the
    allocator's host-side counter: no sync; the training loop reads it in the warm-up steps) and
    other (what the four leave of the peak: workspaces, backward's temporaries; 0 where the peak came
    before every gradient existed, as backward frees activations while it makes gradients)."""

    def __init__(self, device: Any):
        import torch

        self._allocated = lambda: torch.cuda.memory_allocated(device)
        self._before_forward = 0
        self.activations = 0

    def forward_started(self) -> None:
        self._before_forward = self._allocated()

    def forward_ended(self) -> None:
        self.activations = max(self.activations, self._allocated() - self._before_forward)

    def metrics(
        self, peak_gib: float, params: Iterable[Any], trained: Iterable[Any], optimizers: Iterable[Any]
    ) -> dict:
        gib = 2**30
        parts = {
            "peak_params_gb": tensor_bytes(params) / gib,
            "peak_grads_gb": tensor_bytes(trained) / gib,
            "peak_optimizer_state_gb": tensor_bytes(
                t for opt in optimizers for state in opt.state.values() for t in state.values()
            )
            / gib,
            "peak_activations_gb": self.activations / gib,
        }
        return parts | {"peak_other_gb": max(0.0, peak_gib - sum(parts.values()))}
