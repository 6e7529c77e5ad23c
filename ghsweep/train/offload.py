"""Activation offloading: the saved activations of the first N decoder layers live in pinned host
memory between forward and backward (what Megatron's cpu_offloading_num_layers does).

Forward: each large tensor an offloaded layer saves for backward is copied to pinned host memory
on a side stream while later layers compute; `record_stream` lets the caching allocator reuse its
GPU memory as soon as the copy is done.

Backward runs the layers in reverse: when it reaches layer i + d, the tensors of offloaded layer i
start coming back on another side stream, d = `prefetch_layers` layers ahead. The peak stays where
offloading put it for any d up to L - N - 1 (L layers, N offloaded): backward at layer j holds the
activations of layers N..j and of the offloaded layers already fetched (i >= j - d), at most L - N
layers' worth, what the end of forward held. `auto` takes that d, so the copies, which come back one
after another over one link, start as early as they can: fp8 runs a layer's backward in less time
than the link brings a layer back, and at d = N (before auto) the Llama-2-7B shape's steps waited
for them (fp8, 4 layers offloaded on an H200: GPU busy 150 of 200-240 ms a step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Small saved tensors (norm statistics, rotary tables) are not worth a copy each way.
MIN_OFFLOAD_BYTES = 1 << 20


def prefetch_distance(layers: int, offloaded: int, prefetch_layers: int | str) -> int:
    """d, in layers of backward: `prefetch_layers` up to L - N - 1 (auto: L - N - 1), at least 1."""
    earliest = layers - offloaded - 1
    return max(1, earliest if prefetch_layers == "auto" else min(int(prefetch_layers), earliest))


class _Parked:
    """A saved tensor parked in host memory, and its copy back once prefetched."""

    __slots__ = ("host", "device", "on_device", "ready")

    def __init__(self, host: torch.Tensor, device: torch.device):
        self.host = host
        self.device = device
        self.on_device: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None


class ActivationOffload:
    """Wraps every decoder layer of `layers`; the first `num_layers` are offloaded, and each comes back
    `prefetch_layers` layers of backward ahead of use (auto, or more than L - N - 1: L - N - 1)."""

    def __init__(self, layers: nn.ModuleList, num_layers: int, prefetch_layers: int | str):
        self.num_layers = num_layers
        self.prefetch_distance = prefetch_distance(len(layers), num_layers, prefetch_layers)
        self.d2h = torch.cuda.Stream()
        self.h2d = torch.cuda.Stream()
        # Per offloaded layer: its parked tensors not yet fetched back.
        self.parked: list[list[_Parked]] = [[] for _ in range(num_layers)]
        # Tensors packed during the running layer's forward, by storage and layout, held until the
        # layer returns: several ops save the same tensor (the q, k and v projections save one
        # input) and it is copied once; holding them keeps their memory from being reused by a
        # new tensor of the same layout, which the key could not tell apart.
        self._packing: dict[tuple, tuple[torch.Tensor, _Parked]] = {}
        self.bytes_offloaded = 0
        for index in range(len(layers)):
            layers[index] = _HookedLayer(layers[index], self, index)

    def pack(self, index: int, tensor: torch.Tensor) -> Any:
        if (
            index >= self.num_layers
            or not tensor.is_cuda
            or isinstance(tensor, nn.Parameter)
            or tensor.numel() * tensor.element_size() < MIN_OFFLOAD_BYTES
        ):
            return (index, tensor)
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if key in self._packing:
            parked = self._packing[key][1]
        else:
            host = torch.empty_like(tensor, device="cpu", pin_memory=True)
            if host.stride() != tensor.stride():
                # Compiled backward graphs expect the saved strides; a layout empty_like cannot
                # reproduce (overlapping or gapped views) stays on the GPU.
                return (index, tensor)
            self.d2h.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.d2h):
                host.copy_(tensor, non_blocking=True)
            tensor.record_stream(self.d2h)
            parked = _Parked(host, tensor.device)
            self.parked[index].append(parked)
            self._packing[key] = (tensor, parked)
            self.bytes_offloaded += host.numel() * host.element_size()
        return (index, parked)

    def end_layer(self) -> None:
        """Let go of the GPU tensors the layer's forward packed (their copies may still be running:
        record_stream keeps the allocator from reusing them until then)."""
        self._packing.clear()

    def unpack(self, saved: tuple[int, Any]) -> torch.Tensor:
        index, value = saved
        self._prefetch(index - self.prefetch_distance)
        if not isinstance(value, _Parked):
            return value
        self._prefetch(index)  # not fetched ahead (fewer layers after it than the prefetch distance)
        if value.ready is None or value.on_device is None:
            raise RuntimeError(f"layer {index}: a parked tensor was unpacked but never fetched back to the GPU")
        current = torch.cuda.current_stream()
        current.wait_event(value.ready)
        value.on_device.record_stream(current)
        return value.on_device

    def _prefetch(self, index: int) -> None:
        if not 0 <= index < self.num_layers or not self.parked[index]:
            return
        self.h2d.wait_stream(self.d2h)
        with torch.cuda.stream(self.h2d):
            for parked in self.parked[index]:
                parked.on_device = torch.empty_like(parked.host, device=parked.device)
                parked.on_device.copy_(parked.host, non_blocking=True)
                parked.ready = torch.cuda.Event()
                parked.ready.record()
        self.parked[index] = []


class _HookedLayer(nn.Module):
    """Runs the wrapped decoder layer with its saved tensors passing through the offload hooks."""

    def __init__(self, layer: nn.Module, offload: ActivationOffload, index: int):
        super().__init__()
        self.layer = layer
        self._offload = offload
        self._index = index

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        pack = lambda t: self._offload.pack(self._index, t)  # noqa: E731
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, self._offload.unpack):
                return self.layer(*args, **kwargs)
        finally:
            self._offload.end_layer()
