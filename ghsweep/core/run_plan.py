"""What the job decided for one combination, decided once: the dry run prints it, the local and
SLURM paths execute it, and the worker reads it from the run directory (run_plan.json).

Built by ghsweep.launch.run_planner from the composed config and the node's facts, before any GPU time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ghsweep.core.atomic import write_atomic
from ghsweep.core.gpu import GpuInfo
from ghsweep.core.run_dir import RUN_PLAN


@dataclass(frozen=True)
class World:
    """How many nodes and GPUs one combination's training spans (one rank per GPU)."""

    num_nodes: int = 1
    gpus_per_node: int = 1

    @property
    def size(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass
class ProfilePlan:
    """Which profiler a run gets; profile=auto records its choice and why in `note`."""

    requested: str
    used: str  # none | torch | memory | nsys
    ncu: bool = False
    nsys_path: str | None = None
    ncu_path: str | None = None
    note: str | None = None
    # What the profilers run under on the node: the container's `exec ... IMAGE` when the worker
    # runs in one (the image brings nsys and ncu), so the export and ncu's import run there too.
    tool_prefix: list[str] = field(default_factory=list)


@dataclass
class SessionCapture:
    """How a worker forked from the pre-imported worker is recorded by Nsight Systems, in place of
    the `nsys profile` around a worker started from its command: the pre-imported worker runs under
    `launch` (`nsys launch ...`, which traces the workers it forks), and each run is one collection of
    its session, `start` (`nsys start ...`: the worker's capture range, to the run's report). Both
    without the session's name, which is the pre-imported worker's. `handoff`: the collection is
    handed to the worker and back (core/handoff.py; profile.nsys.handoff, for a backend whose loop
    speaks it)."""

    launch: list[str]
    start: list[str]
    handoff: bool = False


@dataclass
class NcuPass:
    """The Nsight Compute pass of profile=nsys_ncu: a short second run of the worker in its own
    folder, under ncu, whose arguments wait for the kernels the run's nsys profile shows."""

    run_dir: str  # the pass's folder, in the run directory
    container_prefix: list[str]  # the run's container, for the pass's folder ([] on the node)
    worker: list[str]  # `python -m ghsweep.train.worker RUN_DIR` of the pass's folder

    def command(self, ncu: list[str]) -> list[str]:
        """The pass's worker under `ncu` (the profiler's command up to the program), in the container."""
        return [*self.container_prefix, *ncu, *self.worker]


@dataclass
class RunPlan:
    name: str  # the combination's name: its MLflow run name and the folder of its run directory
    run_dir: str
    overrides: list[str]
    backend: str  # a name in ghsweep.train.backends.BACKENDS
    # cuda | cpu. A dry run's plans are made before any node is known: a GPU is assumed where the
    # device may be one (and, for profile=auto, a second plan without), and `gpu` stays None.
    device: str
    gpu: GpuInfo | None
    world: World
    data_parallel: str  # ddp | fsdp (what several ranks use; decided for one rank too)
    profile: ProfilePlan
    container_prefix: list[str]  # `apptainer exec ... IMAGE` or [] when the worker runs on the node
    worker_command: list[str]  # one worker's argv: container, profiler and torchrun prefixes included
    timeout_min: float | None  # the worker's wall-clock limit, None for none
    # The ranks are SLURM tasks that srun started, each running one worker; rank 0 waits for the
    # others' rank reports. False: torchrun in worker_command starts the ranks here, or one rank.
    srun_ranks: bool = False
    # worker_command is the worker alone (or under nsys, as `capture` records it) and
    # worker.preimported allows it: a sweep that runs its combinations one after another in its
    # process forks it from a pre-imported worker instead.
    preimported: bool = False
    capture: SessionCapture | None = None
    ncu_pass: NcuPass | None = None  # set where the profile asks for the Nsight Compute pass
    # A trial of a tuning study with tune.prune: the tokens/s its measurement must not fall below beyond the
    # noise (the sweeper sets it per trial as tune.prune_below_tokens_per_s); None: measured to the end.
    prune_below_tokens_per_s: float | None = None
    # A file the worker waits for before its first step that may be measured (train.warmup_steps): a
    # local sweep makes it once its work on the runs before this one is done (launch.followups).
    measure_after: str | None = None
    # What the worker's environment adds for its container (pyxis takes container.env there, off the
    # command line). Its values may be secrets: never written to run_plan.json nor shown, so only the job
    # that made the plan starts its workers with them.
    worker_env: dict[str, str] = field(default_factory=dict, repr=False)

    def save(self, run_dir: Path) -> None:
        # Every SLURM task of a run writes it, and a rank's worker may read it meanwhile.
        saved = asdict(self)
        del saved["worker_env"]
        write_atomic(run_dir / RUN_PLAN, json.dumps(saved, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> RunPlan:
        raw = json.loads((run_dir / RUN_PLAN).read_text())
        gpu = raw.pop("gpu")
        capture = raw.pop("capture", None)
        ncu_pass = raw.pop("ncu_pass", None)
        if gpu is not None:
            gpu["compute_capability"] = tuple(gpu["compute_capability"])
        return cls(
            **raw
            | {
                "gpu": GpuInfo(**gpu) if gpu else None,
                "world": World(**raw.pop("world")),
                "profile": ProfilePlan(**raw.pop("profile")),
                "capture": SessionCapture(**capture) if capture else None,
                "ncu_pass": NcuPass(**ncu_pass) if ncu_pass else None,
            }
        )
