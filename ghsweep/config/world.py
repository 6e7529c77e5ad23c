"""The world of one combination as its config sets it: nodes, GPUs per node, and how several ranks
share the model (read by the launch plan and the profile pipeline alike)."""

from __future__ import annotations

from omegaconf import DictConfig

from ghsweep.config.schema import check
from ghsweep.core.run_plan import World


def world_of(cfg: DictConfig) -> World:
    """The combination's world from `backend.num_nodes` / `backend.gpus_per_node` (1 x 1 when unset)."""
    backend = cfg.backend
    num_nodes, gpus_per_node = backend.get("num_nodes", 1), backend.get("gpus_per_node", 1)
    check("backend.num_nodes", num_nodes)
    check("backend.gpus_per_node", gpus_per_node)
    return World(num_nodes, gpus_per_node)


def data_parallel(cfg: DictConfig) -> str:
    """ddp or fsdp: auto is DDP for LoRA (only the adapters' gradients travel) and FSDP2 for full
    fine-tuning (parameters, gradients and optimizer state sharded)."""
    mode = cfg.backend.get("data_parallel", "auto")
    if mode == "auto":
        return "ddp" if cfg.peft.name == "lora" else "fsdp"
    return mode
