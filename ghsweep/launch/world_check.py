"""Whether this launch can give one combination its world (config.parallelism.world_of): how many nodes and
GPUs its training spans, and the data parallelism of its ranks (a DDP replica under
backend.data_parallel=auto only where its training state fits a GPU: replica_fits).

`backend.num_nodes` x `backend.gpus_per_node` ranks, one process per GPU (on CPU, one gloo process
per "GPU"). Locally the worker runs under torchrun (ghsweep.launch.worker_process.worker_command),
which starts the ranks of one node. On SLURM the launcher asks for the nodes and one task per GPU,
srun starts the tasks, and each task's job exports the rendezvous from SLURM's environment
(ghsweep.launch.slurm.rendezvous) before it starts its one worker.
"""

from __future__ import annotations

from ghsweep.config.parallelism import data_parallel
from ghsweep.config.schema import ConfigSchema, check
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo
from ghsweep.core.run_plan import World
from ghsweep.train.flops import ModelShape

# The share of a GPU's memory a DDP replica's weights, gradients and optimizer states may take under
# backend.data_parallel=auto; the rest is for activations, DDP's buckets and NCCL's buffers.
REPLICA_SHARE = 0.5


def replica_state_gib(config: ConfigSchema) -> float:
    """The weights, gradients and AdamW states of a whole model trained in full, in GiB: two of the
    trained dtype each for weight and gradient, two states in it too (one byte each with adamw8bit)."""
    dtype_bytes = 4 if config.precision.name == "fp32" else 2  # fp8 trains bf16 weights
    state_bytes = 2 if config.train.optimizer == "adamw8bit" else 2 * dtype_bytes
    return ModelShape.of_run(config.model).parameters * (2 * dtype_bytes + state_bytes) / 2**30


def replica_fits(config: ConfigSchema, gpu: GpuInfo | None) -> bool:
    """Whether one GPU holds a replica's training state (replica_state_gib) in REPLICA_SHARE of its
    memory; False without a GPU (nothing to measure against: FSDP2 stays the safe choice)."""
    return gpu is not None and replica_state_gib(config) <= REPLICA_SHARE * gpu.total_mem_gib


def check_world(
    config: ConfigSchema, world: World, on_gpu: bool, visible_gpus: int, slurm_task: bool, replica_fits: bool = False
) -> None:
    """ConfigError when this launch cannot give the combination its `world` (config.parallelism.world_of):
    several nodes without SLURM, more GPUs per node than this machine shows on a local launch, a
    data_parallel this run cannot use (`replica_fits`: as data_parallel reads it)."""
    if world.num_nodes > 1 and not slurm_task:
        raise ConfigError(
            f"backend.num_nodes={world.num_nodes}: several nodes need a SLURM launch profile "
            "(hydra/launcher=local_slurm, gh200 or your site's); this launch runs on one machine; "
            "accepted here: 1"
        )
    if on_gpu and not slurm_task and world.gpus_per_node > visible_gpus:
        raise ConfigError(
            f"backend.gpus_per_node={world.gpus_per_node}: this machine shows {visible_gpus} GPU(s) "
            f"to the run; accepted here: 1 to {visible_gpus}"
        )
    if world.size > 1 and config.profile.name == "nsys_ncu":
        raise ConfigError(
            f"profile=nsys_ncu with {world.size} ranks: the Nsight Compute pass reruns one process; "
            "accepted here: profile=nsys, torch, auto, none (or backend.gpus_per_node=1)"
        )
    if world.size > 1 and config.train.optimizer_in_backward:
        raise ConfigError(
            f"train.optimizer_in_backward=true with {world.size} ranks: each tensor would step on its "
            "own rank's gradient before DDP/FSDP2 averages it; accepted here: false "
            "(or backend.gpus_per_node=1)"
        )
    if config.backend.name == "torch":
        check("backend.data_parallel", config.backend.data_parallel or "auto")
        fsdp = world.size > 1 and data_parallel(config, replica_fits) == "fsdp"
        if fsdp and config.precision.name == "fp8" and config.peft.name == "lora":
            raise ConfigError(
                "backend.data_parallel=fsdp with precision=fp8 and peft=lora: the frozen fp8 base "
                "weights are not sharded; accepted: backend.data_parallel=ddp (or auto)"
            )
        if fsdp and config.train.optimizer == "adamw8bit":
            raise ConfigError(
                f"train.optimizer=adamw8bit with {world.size} ranks under FSDP2: torchao's 8-bit states cannot "
                "step sharded (DTensor) weights (its compiled step needs aten.view.dtype, which they lack); "
                "accepted here: auto, adamw, adamw_sr (or backend.gpus_per_node=1)"
            )
        check("precision.reduce_dtype", config.precision.reduce_dtype)
