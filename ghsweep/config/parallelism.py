"""The world of one combination as its config sets it: nodes, GPUs per node, and how several ranks
share the model (read by the launch plan and the profile pipeline alike)."""

from __future__ import annotations

from ghsweep.config.schema import ConfigSchema, check
from ghsweep.core.run_plan import World


def world_of(config: ConfigSchema) -> World:
    """The combination's world from `backend.num_nodes` / `backend.gpus_per_node` (1 x 1 where the backend
    carries neither)."""
    backend = config.backend
    num_nodes = 1 if backend.num_nodes is None else backend.num_nodes
    gpus_per_node = 1 if backend.gpus_per_node is None else backend.gpus_per_node
    # Checked here too: the launcher groups a sweep's jobs by world before any job validates its config.
    check("backend.num_nodes", num_nodes)
    check("backend.gpus_per_node", gpus_per_node)
    return World(num_nodes, gpus_per_node)


def data_parallel(config: ConfigSchema) -> str:
    """ddp or fsdp: auto is DDP for LoRA (only the adapters' gradients travel) and FSDP2 for full
    fine-tuning (parameters, gradients and optimizer state sharded)."""
    mode = config.backend.data_parallel
    if mode is None or mode == "auto":
        return "ddp" if config.peft.name == "lora" else "fsdp"
    return mode
