"""Whether this launch can give one combination its world (config.parallelism.world_of): how many nodes
and GPUs its training spans, and the data parallelism its ranks would use.

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
from ghsweep.core.run_plan import World


def check_world(config: ConfigSchema, world: World, on_gpu: bool, visible_gpus: int, slurm_task: bool) -> None:
    """ConfigError when this launch cannot give the combination its `world` (config.parallelism.world_of):
    several nodes without SLURM, more GPUs per node than this machine shows on a local launch, a
    data_parallel this run cannot use."""
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
        fsdp = world.size > 1 and data_parallel(config) == "fsdp"
        if fsdp and config.precision.name == "fp8" and config.peft.name == "lora":
            raise ConfigError(
                "backend.data_parallel=fsdp with precision=fp8 and peft=lora: the frozen fp8 base "
                "weights are not sharded; accepted: backend.data_parallel=ddp (or auto)"
            )
        if fsdp and not on_gpu and config.backend.fsdp_all_gather == "copy_engine":
            raise ConfigError(
                "backend.fsdp_all_gather=copy_engine on CPU: the copy engines' all-gather needs GPUs (NCCL's "
                "symmetric memory), where gloo's ranks have none; accepted here: nccl or auto"
            )
        if fsdp and config.train.optimizer == "adamw8bit":
            raise ConfigError(
                f"train.optimizer=adamw8bit with {world.size} ranks under FSDP2: torchao's 8-bit states cannot "
                "step sharded (DTensor) weights (its compiled step needs aten.view.dtype, which they lack); "
                "accepted here: auto, adamw, adamw_sr (or backend.gpus_per_node=1)"
            )
        check("precision.reduce_dtype", config.precision.reduce_dtype)
