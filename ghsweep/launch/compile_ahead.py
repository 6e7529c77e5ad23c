"""Compile ahead (`worker.compile_ahead`): on the default launcher, the graphs of every compiled
configuration of a sweep that its first combination does not share are compiled while that first
combination compiles its own, so that no later combination waits for a cold compile.

A cold sweep otherwise compiles once per configuration, one after another: on one H200 bf16 took
16-23 s and fp8 22-31 s, most of a cold sweep's fixed cost (docs/sweep-time.md). Each configuration
is compiled by a worker of its own on a model of two decoder layers (the same layer, loss and shapes:
the graphs the full model compiles, in the sweep's compile cache; under LoRA the first layer's input
needs no gradient and the later layers' do, so two layers hold both of the layer's graphs), trained
two steps, without a profiler, offload or measurement. They start beside the first combination
and end before its first step that may be measured: they are the first of the sweep's follow-ups
(launch/followups.py), which each worker waits for (RunPlan.measure_after). A worker that fails here
costs nothing but its time: the combination then compiles its graphs itself, as without this. They
share the GPU with the first combination's set-up and compile: if it runs out of GPU memory meanwhile,
it is run again once they have ended (job.train_with_retries), so their memory never fails a run.

A configuration compiled ahead into a train.compile_cache_dir leaves a file there (`compiled-ahead-*`,
named after its graphs, torch, Triton and the GPU), so a later sweep on that cache starts no worker
for it: on a warm cache those workers' start (a fresh interpreter each) would only be time the first
combination might wait for.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import json
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from ghsweep.config.parallelism import world_of
from ghsweep.config.schema import typed
from ghsweep.config.validate import run_device
from ghsweep.core.errors import one_line
from ghsweep.core.gpu import GpuInfo, probe_gpu
from ghsweep.core.run_dir import SUMMARY, WORKER_LOG
from ghsweep.launch import followups
from ghsweep.launch.job import write_worker_config
from ghsweep.launch.run_planner import node_plan
from ghsweep.launch.worker_process import run_worker

log = logging.getLogger(__name__)

# Beside the sweep's runs: a worker's directory while it compiles, and after, where it failed.
FOLDER = ".compile_ahead"
# What the torch backend's compiled graphs depend on. Either mistake costs only time: a key missing
# here takes two configurations for one (the second compiles its graphs itself), and a key here that
# changes no graph adds a compile ahead.
GRAPH_KEYS = (
    "backend.name",
    "model",
    "precision",
    "peft",
    "data.packing_mask",
    "train.seq_length",
    "train.micro_batch_size",
    "train.compile",
    "train.attention",
    "train.activation_memory_budget",
    "train.optimizer",
)
LAYERS = 2
STEPS = 2
# A compile that takes longer than this is stopped (its combination compiles for itself).
TIMEOUT_S = 600


def run_config(cfg: DictConfig) -> DictConfig:
    """`cfg` (a launcher's composed combination) without Hydra's own node, its values resolved."""
    values = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(values, dict)
    values.pop("hydra", None)
    resolved = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    assert isinstance(resolved, dict)
    return OmegaConf.create(resolved)


def graph_key(cfg: DictConfig) -> str:
    """What the compiled graphs of `cfg` (run_config's) depend on, as one string: equal keys, the same graphs."""
    values = {key: OmegaConf.select(cfg, key) for key in GRAPH_KEYS}
    return json.dumps(
        {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in values.items()}, sort_keys=True
    )


def ahead_config(cfg: DictConfig) -> DictConfig:
    """`cfg` (run_config's) as a compile-ahead worker trains it: two layers, two steps, no profiler,
    offload or measurement."""
    ahead = copy.deepcopy(cfg)
    with open_dict(ahead):
        ahead.model.num_layers = LAYERS
        ahead.train.max_steps = STEPS
        ahead.train.warmup_steps = 1
        ahead.train.measure = False
        ahead.profile = {"name": "none"}
        ahead.offload = {"enabled": False, "num_layers": 0}
    return ahead


def configurations(composed: Sequence[DictConfig]) -> list[DictConfig]:
    """One config per compiled configuration of `composed` (a sweep's combinations, in order) that the
    first does not share and its compile cache holds no mark of; a single-GPU run of the torch backend
    that compiles on this machine only."""
    gpu = probe_gpu()
    seen: set[str] = set()
    ahead = []
    for index, cfg in enumerate(run_config(c) for c in composed):
        key = graph_key(cfg)
        if key in seen:
            continue
        seen.add(key)
        if index == 0 or not compiles_alone(cfg, gpu):
            continue
        mark = compiled_mark(cfg, gpu)
        if mark is None or not mark.exists():
            ahead.append(cfg)
    return ahead


def compiled_mark(cfg: DictConfig, gpu: GpuInfo | None) -> Path | None:
    """The file that says `cfg`'s graphs were compiled ahead into its train.compile_cache_dir by this
    torch and Triton for this GPU; None without a compile_cache_dir (torch's own cache, one per machine)."""
    root = cfg.train.compile_cache_dir
    if root is None:
        return None
    versions = []
    for package in ("torch", "triton"):
        try:
            versions.append(importlib.metadata.version(package))
        except importlib.metadata.PackageNotFoundError:
            versions.append("none")
    device = gpu.name if gpu else "cpu"
    digest = hashlib.sha256(json.dumps([graph_key(cfg), versions, device]).encode()).hexdigest()[:16]
    # A file, not a folder: the folders beside it are caches of each torch, Triton and device.
    return Path(root).absolute() / f"compiled-ahead-{digest}"


def compiles_alone(cfg: DictConfig, gpu: GpuInfo | None) -> bool:
    """Whether `cfg` (run_config's) trains compiled layers on a node with `gpu`, in one process of the
    torch backend (several ranks compile other graphs: DDP's and FSDP2's)."""
    config = typed(cfg)
    on_gpu = run_device(config, gpu) == "cuda"
    return config.backend.name == "torch" and world_of(config).size == 1 and config.train.compiles(on_gpu)


def start(composed: Sequence[DictConfig], sweep_dir: Path) -> None:
    """Compile `composed`'s configurations ahead (configurations()) on the sweep's follow-up thread,
    before anything else runs there; nothing where there is nothing to compile."""
    todo = configurations(composed)
    if todo:
        followups.run(lambda: compile_all(todo, sweep_dir / FOLDER))


def compile_all(todo: Sequence[DictConfig], folder: Path) -> None:
    """Run a compile-ahead worker for each of `todo`, side by side; return when all have ended."""
    started = time.time()
    log.info("  compiling %d more configuration(s) ahead, beside the first combination", len(todo))
    threads = [
        threading.Thread(target=compile_one, args=(cfg, folder / str(index)), name="ghsweep-compile-ahead")
        for index, cfg in enumerate(todo)
    ]
    with followups.on_the_gpu():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    with contextlib.suppress(OSError):  # kept where a worker failed: its log is there
        folder.rmdir()
    log.info("  compiled ahead in %.1f s", time.time() - started)


def compile_one(cfg: DictConfig, run_dir: Path) -> None:
    """One compile-ahead worker for `cfg` in `run_dir` (removed once it has compiled; kept with its log
    where it failed); what goes wrong is logged, never raised."""
    failed = f"  compiling ahead for {precision_of(cfg)} failed (%s): its combinations compile for themselves"
    try:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        ahead = ahead_config(cfg)
        write_worker_config(ahead, run_dir)  # as a run's: readable by the user only where it holds a secret
        plan, _ = node_plan(ahead, run_dir, "compile ahead", [], probe_gpu(), None)
        plan.save(run_dir)
        # A fresh interpreter, outside any profiler's session; what it leaves running is ended with it.
        exit = run_worker(plan.worker_command, run_dir, TIMEOUT_S, env=plan.worker_env, progress=False)
        if exit.returncode != 0 or exit.timed_out:
            why = f"timed out after {TIMEOUT_S} s" if exit.timed_out else f"exit {exit.returncode}"
            log.warning(failed, f"{why}; log: {run_dir / WORKER_LOG}")
            return
        info = json.loads((run_dir / SUMMARY).read_text()).get("info", {})
        mark = compiled_mark(cfg, probe_gpu())
        if mark is not None:
            mark.touch()
    except Exception as exc:  # compiling ahead only saves time: nothing here may stop the sweep
        shutil.rmtree(run_dir, ignore_errors=True)
        log.warning(failed, one_line(exc))
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    log.info(
        "  compiled ahead for %s: %d graph(s) compiled, %d loaded",
        precision_of(cfg),
        info.get("compile_fxgraph_cache_misses", 0),
        info.get("compile_fxgraph_cache_hits", 0),
    )


def precision_of(cfg: DictConfig) -> str:
    return f"precision={OmegaConf.select(cfg, 'precision.name')} peft={OmegaConf.select(cfg, 'peft.name')}"
