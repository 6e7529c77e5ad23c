"""A world of real gloo processes on this machine (or NCCL, one per GPU), for tests of what several
ranks compute together: `on_ranks(fn, world, *args)` runs `fn(rank, *args)` in each, with the env://
variables torchrun would give it and the process group started by ghsweep's own code."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing

from tests.support.ports import free_port


def _rank(
    rank: int, world: int, port: int, on_gpu: bool, copy_engine: bool, fn: Callable[..., None], args: tuple
) -> None:
    from ghsweep.train import distributed

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank)}
    os.environ["WORLD_SIZE"] = str(world)
    ranks = distributed.ranks_from_env()
    device = distributed.rank_device(torch.device("cuda" if on_gpu else "cpu"), ranks)
    distributed.start(ranks, device, copy_engine)
    try:
        fn(ranks, device, *args)
        # Teardown hygiene (a rank once died with SIGABRT in CI, cause not reproduced): FSDP2's hooks keep
        # the model in reference cycles that may hold collective work, so free them while the group lives;
        # and no rank closes its connections while a peer may still be using them.
        gc.collect()
        torch.distributed.barrier()
    finally:
        distributed.stop(ranks)


def on_ranks(fn: Callable[..., None], world: int, *args: Any, on_gpu: bool = False, copy_engine: bool = False) -> None:
    """`fn(ranks, device, *args)` on `world` ranks (a module-level function: it is pickled to each);
    `copy_engine`: the process group started as for backend.fsdp_all_gather=copy_engine."""
    torch.multiprocessing.spawn(_rank, args=(world, free_port(), on_gpu, copy_engine, fn, args), nprocs=world)
