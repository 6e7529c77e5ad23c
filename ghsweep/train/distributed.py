"""Data parallelism in the worker: the rank's place in the world, its device, DDP or FSDP2.

The launch side starts one worker per GPU, under torchrun (ghsweep.launch.worker_process) or as
SLURM tasks (ghsweep.launch.slurm.rendezvous); both give the worker torch.distributed's env://
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
A worker without them is a world of one and runs as before.
NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

try:  # FSDP2's custom all-gather interface (set_custom_all_gather, torch >= 2.8), in a private module of torch
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
except ImportError:  # copy_engine_missing says so before anything would use it
    AllGather = object  # type: ignore[misc,assignment]

from ghsweep.config.schema import ConfigSchema


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run's records (metrics.jsonl, summary.json); the others only train."""
        return self.rank == 0


def ranks_from_env() -> Ranks:
    return Ranks(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """The rank's own GPU (LOCAL_RANK among those visible), or the device as it is."""
    if device.type != "cuda" or ranks.world_size == 1:
        return device
    index = ranks.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


# NCCL's zero-CTA policy (NCCL >= 2.28): a collective on symmetric-memory buffers that the copy engines can
# move (an all-gather within a node) runs on them, with no kernel on the SMs; the rest run as before.
CTA_POLICY_ENV, CTA_POLICY_ZERO = "NCCL_CTA_POLICY", "2"
COPY_ENGINE_NCCL = (2, 28)


def fsdp_all_gather(config: ConfigSchema, ranks: Ranks, mode: str | None, device: torch.device) -> str | None:
    """nccl | copy_engine: how FSDP2 gathers the weights (backend.fsdp_all_gather, auto resolved), None
    where nothing is gathered (one rank, or DDP: `mode` is the plan's data_parallel). auto is copy_engine
    on the GPUs of one node where NCCL and torch have it (two H200s, 7B full fine-tuning: 2.1% off the step,
    docs/multi-gpu.md), else nccl; across nodes it is unmeasured."""
    if ranks.world_size == 1 or mode != "fsdp":
        return None
    choice = config.backend.fsdp_all_gather
    if choice != "auto":
        return choice
    one_node = config.backend.num_nodes == 1
    return "copy_engine" if device.type == "cuda" and one_node and copy_engine_missing() is None else "nccl"


def copy_engine_missing() -> str | None:
    """What this machine lacks for the copy engines' all-gather, or None where it has it all."""
    from torch.distributed.fsdp import FSDPModule

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.nccl.version() < COPY_ENGINE_NCCL:
        return f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} has no zero-CTA policy (NCCL >= 2.28 has)"
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        return f"this torch ({torch.__version__}) has no FSDPModule.set_custom_all_gather"
    return None


def start(ranks: Ranks, device: torch.device, copy_engine: bool = False) -> None:
    """Join the process group (nothing for a world of one); `copy_engine`: with NCCL's zero-CTA policy
    (fsdp_all_gather's copy_engine), unless the environment already names a policy."""
    if copy_engine:
        missing = copy_engine_missing()
        if missing:
            raise RuntimeError(f"backend.fsdp_all_gather=copy_engine: {missing}; accepted here: nccl or auto")
        # NCCL reads it as the communicator is made, which device_id below makes at once.
        os.environ.setdefault(CTA_POLICY_ENV, CTA_POLICY_ZERO)
    if ranks.world_size > 1:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
        )


def stop(ranks: Ranks) -> None:
    if ranks.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


class LossHead(nn.Module):
    """The LM head and the loss over its weight (the loss never materialises the logits through the head's
    own forward): a module whose forward FSDP2 sees, so that it can shard the head as a unit of its own."""

    def __init__(self, lm_head: nn.Module, loss_fn):
        super().__init__()
        self.lm_head, self.loss_fn = lm_head, loss_fn

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(hidden, self.lm_head.weight, labels)


class TrainStep(nn.Module):
    """Decoder, LM head and loss as one module, so DDP and FSDP2 see the whole step's forward."""

    def __init__(self, decoder: nn.Module, lm_head: nn.Module, loss_fn):
        super().__init__()
        self.decoder, self.head = decoder, LossHead(lm_head, loss_fn)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **decoder_kwargs) -> torch.Tensor:
        hidden = self.decoder(input_ids=input_ids, use_cache=False, **decoder_kwargs)[0]
        return self.head(hidden, labels)


REDUCE_DTYPES = {"fp32": torch.float32, "param": None}


def reduce_dtype(choice: str, world_size: int) -> str:
    """fp32 or param: what `precision.reduce_dtype=choice` sums gradients in across `world_size` ranks.

    auto is the gradients' own dtype on two ranks and fp32 on more. Two ranks add one pair of values,
    which NCCL and gloo add in fp32 and round once, as the fp32 reduction rounds its sum back to the
    gradients' dtype: the same bits at half the bytes (tests/train/test_reduce_dtype.py). On more ranks
    a ring rounds after each of its adds, and fp32 keeps the bits."""
    if choice == "auto":
        return "param" if world_size <= 2 else "fp32"
    return choice


def parallelize(
    step: TrainStep, config: ConfigSchema, ranks: Ranks, mode: str
) -> tuple[nn.Module, str | None, str | None]:
    """(the module the loop calls, ddp | fsdp, fp32 | param), None for both in a world of one; `mode`
    is the plan's data_parallel. FSDP2 shards each decoder layer, the LM head, and then the rest
    (embedding, final norm); gradients are reduced in precision.reduce_dtype, as reduce_dtype resolves it."""
    if ranks.world_size == 1:
        return step, None, None
    resolved = reduce_dtype(config.precision.reduce_dtype, ranks.world_size)
    summed_in = REDUCE_DTYPES[resolved]
    if mode == "ddp":
        # Every rank built the same weights from the same seed (or folder): no broadcast at start; the buffers
        # (rotary frequencies) never change: no broadcast before every forward either, which would line the
        # ranks up at each step's start. No device_ids: the batch is on the device already, and DDP would
        # copy the attention mask object. Gradients live in DDP's buckets: no second copy of them.
        ddp = nn.parallel.DistributedDataParallel(
            step, init_sync=False, broadcast_buffers=False, gradient_as_bucket_view=True
        )
        if summed_in == torch.float32:
            # DDP checks a hook's annotations against its own classes; this module's are strings.
            ddp.register_comm_hook(None, lambda state, bucket: _mean_in_fp32(bucket))
        return ddp, mode, resolved
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(reduce_dtype=summed_in)
    # false: a layer's gathered weights stay until its backward (one all-gather per step instead of two,
    # the full weights in memory as with DDP); true: resharded after forward (ZeRO-3, least memory).
    reshard = bool(config.backend.fsdp_reshard_after_forward)
    layers = step.decoder.layers
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"FSDP2 shards each decoder layer: the decoder's layers are a {type(layers).__name__}")
    for layer in layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    # The LM head as a unit of its own, as torchtitan shards its output layer: its all-gather is issued
    # behind the last layers' forward and its reduce-scatter runs beside the layers' backward. In the root
    # (the embedding and the final norm as well) both waited at the step's ends: an all-gather before the
    # first layer and the last reduce-scatter after the embedding's backward. A head tied to the embedding
    # (one weight) stays in the root with it.
    head_weight = step.head.lm_head.weight
    if not any(p is head_weight for p in step.decoder.parameters()):
        fully_shard(step.head, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(step, mp_policy=policy, reshard_after_forward=reshard)
    weights_on = next(step.parameters()).device
    if fsdp_all_gather(config, ranks, mode, weights_on) == "copy_engine":
        use_copy_engine_all_gather(step)
    return step, mode, resolved


def use_copy_engine_all_gather(root: nn.Module) -> None:
    """Every FSDP2 unit under `root` gathers its weights into NCCL's symmetric memory, which NCCL's
    zero-CTA policy (start) moves with the copy engines: torch's Copy Engine All-Gather, through FSDP2's
    custom all-gather hook. The reduce-scatters stay NCCL's kernels. (torch's set_symm_mem_for_comm, in
    newer torch than 2.11, would move the reduce-scatters to symmetric memory too: unmeasured.)"""
    from torch.distributed.fsdp import FSDPModule

    gather = SymmetricMemoryAllGather()
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            unit.set_custom_all_gather(gather)


class SymmetricMemoryAllGather(AllGather):
    """FSDP2's all-gather into buffers from NCCL's symmetric-memory pool (as torch's SymmMemAllGather):
    an all-gather on such buffers is NCCL's Copy Engine All-Gather under the zero-CTA policy."""

    def __init__(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self._symm_mem = symm_mem
        symm_mem.set_backend("NCCL")
        dist.barrier()  # the communicator exists before the first rendezvous

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        with torch.cuda.use_mem_pool(self._symm_mem.get_mem_pool(device)):
            return torch.empty(size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False
    ) -> dist.Work | None:
        # In place: the input is this rank's slice of the output, so only the output is exchanged.
        self._symm_mem.rendezvous(output_tensor, group=group.group_name)
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def _mean_in_fp32(bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's gradient average summed in fp32 (precision.reduce_dtype=fp32), as FSDP2's reduce_dtype
    does: bf16 gradients summed in bf16 lose bits with every rank added."""
    grads = bucket.buffer()
    wide = grads.float().div_(dist.get_world_size())
    future = dist.all_reduce(wide, async_op=True).get_future()

    def narrow(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        return grads.copy_(done.value()[0])

    return future.then(narrow)


def after_optimizer_step(model: nn.Module, mode: str | None, fp8_library: str | None) -> None:
    """torchao's fp8 all-gather under FSDP2 needs the weights' scales once per step, in one all-reduce."""
    if mode == "fsdp" and fp8_library == "torchao":
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def gather(value: object, ranks: Ranks) -> list:
    """`value` of every rank, in rank order (a world of one: [value])."""
    if ranks.world_size == 1:
        return [value]
    out: list = [None] * ranks.world_size
    dist.all_gather_object(out, value)
    return out


def from_rank0(value: object, ranks: Ranks) -> object:
    """Rank 0's `value` on every rank (a world of one: `value`)."""
    if ranks.world_size == 1:
        return value
    out = [value]
    dist.broadcast_object_list(out, src=0)
    return out[0]


def rank_summary(step_times_ms: list[list[float]], peaks_gib: list[float], warmup_steps: int) -> dict:
    """Per-rank steady step times (median after warm-up), the slowest rank and the spread."""
    medians = [statistics.median(t[warmup_steps:] or t) for t in step_times_ms]
    slowest = max(range(len(medians)), key=medians.__getitem__)
    middle = statistics.median(medians)
    return {
        "rank_step_time_ms": medians,
        "rank_peak_mem_gb": peaks_gib,
        "slowest_rank": slowest,
        "slowest_rank_step_time_ms": medians[slowest],
        # How much slower the slowest rank's steps are than the median rank's.
        "rank_spread_pct": 100.0 * (medians[slowest] - middle) / middle if middle else 0.0,
    }
