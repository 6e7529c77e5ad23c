"""The tasks of a SLURM job that runs one combination on several GPUs: srun starts one task per GPU,
and each task's job exports the rendezvous of torch.distributed from SLURM's environment before it
starts its one worker."""

from __future__ import annotations

import os


def slurm_task_ranks() -> int | None:
    """The number of tasks of the submitit SLURM job this process is a task of, None outside one."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    import submitit

    return submitit.JobEnvironment().num_tasks


# Where rank 0's rendezvous listens when the first node's name does not resolve on the nodes (a
# launch profile's `setup` line exports it); else the first node of the job.
MASTER_ADDR_ENV = "GHSWEEP_MASTER_ADDR"


def export_slurm_rendezvous() -> int:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from SLURM's environment for the
    worker this task starts; returns this task's global rank."""
    import submitit

    # CUDA_VISIBLE_DEVICES stays as SLURM set it: the worker picks its GPU by LOCAL_RANK, as under torchrun.
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    if os.environ.get(MASTER_ADDR_ENV):
        os.environ["MASTER_ADDR"] = os.environ[MASTER_ADDR_ENV]
    return env.rank
