"""One combination of a sweep: validate, train in a worker process, record in MLflow.

This is the Hydra task function's body. It never raises for a failed run inside a sweep: the
failure is recorded (MLflow status FAILED, tag `ghsweep.error`, worker log attached) and the
sweep goes on.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ghsweep.config.validate import run_device, validate
from ghsweep.launch import interrupts
from ghsweep.launch.container import check_container, container_prefix, tool_finder
from ghsweep.launch.device_probe import probe_gpu
from ghsweep.launch.dry_run import describe
from ghsweep.launch.rank_reports import wait_for_ranks, write_rank_report
from ghsweep.core.names import ERROR_TAG, HOST_TAG, JOB_NUM_TAG, OVERRIDES_TAG, ROLE_RUN, RUN_DIR_TAG, RUN_HASH_TAG, STATUS_TAG
from ghsweep.launch.resume import finished_run, run_hash, skip_finished
from ghsweep.core.run_result import RunResult
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.launch.worker_process import (WORKER_LOG, WorkerExit, rank_file, run_worker, worker_command,
                                           worker_timeout_min)
from ghsweep.launch.world import check_world, export_slurm_rendezvous, slurm_task_ranks
from ghsweep.profile.capture import find_tool
from ghsweep.core.run_plan import ProfilePlan
from ghsweep.profile.pipeline import ProfileOutcome, after_worker
from ghsweep.profile.plan import profiler_prefix, resolve as resolve_profile, save_plan
from ghsweep.report.run_report import write_run_report
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import MlflowStore, absolute_tracking_uri, flatten
from ghsweep.core.errors import ConfigError, JobTimeout, TrackingUriError, one_line

log = logging.getLogger(__name__)

# Less free space than this under a failed run's directory: the disk was full.
FULL_DISK_BYTES = 1 << 20
# Config groups recorded as plain params (e.g. precision=bf16) beside the flattened config.
KNOB_GROUPS = ("peft", "precision", "offload", "memory", "dataloader", "model", "data", "backend", "profile")


def git_commit() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def no_space_left(run_dir: Path) -> str | None:
    """The reason for a run whose file system is full, else None."""
    free = shutil.disk_usage(run_dir).free
    return f"no space left on device under {run_dir} ({free} bytes free)" if free < FULL_DISK_BYTES else None


def failure_reason(run_dir: Path, exit: WorkerExit, timeout_min: float | None, rank: int = 0) -> str:
    # A worker that filled the disk cannot say so: its error file and log are cut short too.
    full = no_space_left(run_dir)
    if full:
        return full
    error_file = run_dir / "worker_error.json"
    if error_file.exists():
        error = json.loads(error_file.read_text())
        return f"{error['type']}: {error['message']}"
    if exit.timed_out:
        return f"worker timed out after {timeout_min:g} min (worker.timeout_min) and was killed"
    if exit.returncode < 0:
        name = signal.Signals(-exit.returncode).name
        hint = " (killed from outside, often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"worker killed by {name}{hint}"
    lines = (run_dir / rank_file(WORKER_LOG, rank)).read_text(errors="replace").strip().splitlines()
    return f"worker exited with status {exit.returncode}: {lines[-1] if lines else 'no output'}"


def shown_config(cfg: DictConfig) -> str:
    """The resolved config as records show it: secrets redacted."""
    return OmegaConf.to_yaml(OmegaConf.create(redact.config(OmegaConf.to_container(cfg, resolve=True))))


def write_worker_config(cfg: DictConfig, run_dir: Path) -> None:
    """config.yaml, the worker's input, with the real values; readable by the user only when it
    holds a secret (MLflow gets the redacted copy)."""
    real = OmegaConf.to_yaml(cfg, resolve=True)
    # Written aside and renamed: the SLURM tasks of one run all write it, and a rank's worker may read it meanwhile.
    with tempfile.NamedTemporaryFile("w", dir=run_dir, prefix=".config.", suffix=".yaml", delete=False) as tmp:
        tmp.write(real)
    if real == shown_config(cfg):
        os.chmod(tmp.name, 0o644)
    os.replace(tmp.name, run_dir / "config.yaml")


def plan_profile(cfg: DictConfig, run_dir: Path, on_gpu: bool) -> ProfilePlan:
    """The run's profile plan on this node. With a container the profilers run inside it, so they
    are looked up there and their export runs there too."""
    in_container = container_prefix(cfg, run_dir)
    plan = resolve_profile(cfg.profile, on_gpu, str(cfg.device), tool_finder(in_container) if in_container else find_tool)
    plan.tool_prefix = in_container
    return plan


@dataclass(frozen=True)
class WorkerLaunch:
    """How this task starts its worker, decided on the node before any training."""

    command: list[str]
    timeout_min: float | None
    profile_plan: ProfilePlan
    world_size: int
    # The other ranks are SLURM tasks that report through rank files (False: torchrun's, or none).
    slurm_ranks: bool


def prepare_worker(cfg: DictConfig, run_dir: Path, slurm_tasks: int | None) -> WorkerLaunch:
    """Check the config on this node and build the worker command; ConfigError for a run that cannot
    start here. Every SLURM task of a run makes the same checks, so a config rank 0 refuses is
    refused by all ranks before any of them waits for the others."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]}=???: required and not set; set it on the command line, e.g. {missing[0]}=...")
    write_worker_config(cfg, run_dir)
    gpu = probe_gpu()
    validate(cfg, gpu)
    check_container(cfg)
    on_gpu = run_device(cfg, gpu) == "cuda"
    world = check_world(cfg, on_gpu, gpu.count if gpu else 0, slurm_tasks is not None)
    if slurm_tasks is not None and slurm_tasks != world.size:
        raise ConfigError(f"backend.num_nodes x backend.gpus_per_node = {world.size} ranks, but this SLURM job has "
                          f"{slurm_tasks} tasks; let ghsweep's launcher set hydra.launcher.nodes and tasks_per_node")
    timeout_min = worker_timeout_min(cfg.worker.timeout_min, on_gpu)
    plan = plan_profile(cfg, run_dir, on_gpu)
    # Locally torchrun starts the node's ranks; on SLURM srun already started one task per rank.
    local_ranks = world.gpus_per_node if slurm_tasks is None else 1
    command = worker_command(cfg, run_dir, profiler_prefix(cfg, run_dir, plan), local_ranks)
    return WorkerLaunch(command, timeout_min, plan, world.size, slurm_tasks is not None and world.size > 1)


def run_one(cfg: DictConfig) -> RunResult:
    started = time.time()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    redact.remember(cfg, hydra_cfg.overrides.task)
    # What records and the console show; the worker gets the real values through config.yaml.
    overrides = redact.overrides(hydra_cfg.overrides.task)
    name = redact.run_name(hydra_cfg.job.override_dirname or "run")
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if k in KNOB_GROUPS}
    if cfg.dry_run:
        launcher = hydra_cfg.runtime.choices.get("hydra/launcher")
        print(describe(hydra_cfg.job.num if in_sweep else 0, name, run_dir, cfg, f"in this process (hydra/launcher={launcher})"),
              flush=True)
        return RunResult(name=name, run_dir=str(run_dir), overrides=overrides, status="DRY_RUN")

    slurm_tasks = slurm_task_ranks()
    rank = export_slurm_rendezvous() if slurm_tasks and slurm_tasks > 1 else 0
    if rank > 0:
        return run_rank(cfg, run_dir, rank, slurm_tasks, RunResult(name=name, run_dir=str(run_dir), overrides=overrides,
                                                                  status="FAILED"))

    manifest = SweepManifest.load(Path(hydra_cfg.sweep.dir)) if in_sweep else None
    uri = manifest.tracking_uri if manifest else absolute_tracking_uri(cfg.tracking.uri, hydra_cfg.runtime.cwd)
    try:
        store = MlflowStore(uri, manifest.experiment if manifest else cfg.tracking.experiment)
    except TrackingUriError as exc:  # no run can be recorded: one line, not a traceback
        raise SystemExit(f"ghsweep: {exc}") from None
    identity = run_hash(cfg)
    earlier = finished_run(store, identity) if in_sweep and not cfg.force else None
    if earlier is not None:
        return skip_finished(earlier, name, run_dir, overrides)
    run_id = store.start_run(
        name,
        ROLE_RUN,
        tags={
            RUN_DIR_TAG: str(run_dir),
            OVERRIDES_TAG: " ".join(overrides),
            "mlflow.source.git.commit": git_commit(),
            HOST_TAG: socket.gethostname(),
            RUN_HASH_TAG: identity,
            # Job order is the sweep's combination order; run start times are not, with parallel launchers.
            JOB_NUM_TAG: str(hydra_cfg.job.num) if in_sweep else "0",
        },
        parent_run_id=manifest.parent_run_id if manifest else None,
    )
    store.log_params(run_id, {**choices, **flatten(OmegaConf.to_container(cfg, resolve=True))})
    result = RunResult(name=name, run_dir=str(run_dir), overrides=overrides, status="FAILED", mlflow_run_id=run_id)
    summary: dict = {}
    profile = ProfileOutcome()
    interrupt: KeyboardInterrupt | None = None
    try:
        # On disk from the start: a job killed from outside leaves its MLflow run id to whoever settles it.
        dataclasses.replace(result, status="RUNNING").save()
        (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
        launch = prepare_worker(cfg, run_dir, slurm_tasks)
        timeout_min = launch.timeout_min
        timeout_s = timeout_min * 60 if timeout_min else None
        profile_plan = launch.profile_plan
        save_plan(profile_plan, run_dir)
        # The command in the job's log: what `dry_run=true` printed for this combination, with the node's choices.
        log.info("%s: training in a worker process (log: %s): %s", name, run_dir / WORKER_LOG, shlex.join(launch.command))
        exit = run_worker(launch.command, run_dir, timeout_s)
        other_ranks_error = wait_for_ranks(run_dir, launch.world_size) if launch.slurm_ranks else None
        if exit.returncode == 0 and other_ranks_error:
            result.error = other_ranks_error
        elif exit.returncode == 0:
            summary = json.loads((run_dir / "summary.json").read_text())
            result.status = "FINISHED"
            result.metrics = summary["metrics"]
            train = summary["timing"]
            result.timing = {
                "startup_s": train["ready_at"] - exit.started_at + train["import_s"],
                "setup_s": train["setup_s"],
                "train_s": train["train_s"],
            }
            # The ncu pass reruns a short worker in a subfolder, under ncu in place of nsys (inside the container).
            profile = after_worker(cfg, run_dir, profile_plan, lambda prefix, work: run_worker(
                worker_command(cfg, work, prefix), work, timeout_s).returncode)
            result.metrics.update(profile.metrics)
        else:
            result.error = failure_reason(run_dir, exit, timeout_min)
    except (ConfigError, JobTimeout) as exc:
        result.error = str(exc)
    except Exception as exc:  # a bug, an outage or a full disk must not stop the sweep or lose the run
        result.status = "FAILED"
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            result.error = no_space_left(run_dir) or f"no space left on device under {run_dir}: {one_line(exc)}"
        else:
            log.exception("%s: ghsweep failed around the worker", name)
            result.error = one_line(exc)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: run_worker has stopped the worker's process group
        result.status, result.error = "KILLED", interrupts.reason(exc)
        interrupt = exc

    if result.error:
        log.error("%s: %s: %s", name, result.status, result.error)
    try:
        _record(store, run_id, cfg, run_dir, result, summary, profile, started)
    except Exception:  # MLflow unreachable even after retries: the run's own files hold the record
        log.exception("%s: the MLflow record is incomplete; the run's record is complete in %s", name, run_dir)
    if interrupt is not None:
        raise interrupt
    return result


def run_rank(cfg: DictConfig, run_dir: Path, rank: int, slurm_tasks: int, result: RunResult) -> RunResult:
    """A SLURM task of rank > 0: train this rank and say how it ended in rankN.json; rank 0's task
    records the run (MLflow, profile analysis over every rank's report)."""
    try:
        launch = prepare_worker(cfg, run_dir, slurm_tasks)
        log.info("%s: rank %d training in a worker process (log: %s): %s", result.name, rank,
                 run_dir / rank_file(WORKER_LOG, rank), shlex.join(launch.command))
        exit = run_worker(launch.command, run_dir, launch.timeout_min * 60 if launch.timeout_min else None, rank)
        if exit.returncode == 0:
            result.status = "FINISHED"
        else:
            result.error = failure_reason(run_dir, exit, launch.timeout_min, rank)
    except Exception as exc:  # whatever stops this rank, rank 0 must hear of it rather than wait
        result.error = str(exc) if isinstance(exc, ConfigError) else one_line(exc)
    write_rank_report(run_dir, rank, result.status, result.error)
    return result


def _finish_timing(result: RunResult, started: float, record_started: float) -> None:
    result.timing["record_s"] = time.time() - record_started
    result.timing["wall_s"] = time.time() - started
    if "train_s" in result.timing:
        result.timing["overhead_s"] = result.timing["wall_s"] - result.timing["train_s"]


def _save_run_files(result: RunResult, cfg: DictConfig, info: dict, run_dir: Path) -> None:
    """report.md and result.json. A full disk is logged, not raised: MLflow still gets the record."""
    try:
        write_run_report(result, cfg, info, run_dir / "report.md")
        result.save()
    except OSError as exc:
        log.error("%s: the run's files could not be written in %s: %s", result.name, run_dir, exc)


def _record(store: MlflowStore, run_id: str, cfg: DictConfig, run_dir: Path, result: RunResult,
            summary: dict, profile: ProfileOutcome, started: float) -> None:
    """Report, result.json and MLflow: everything the run measured, whatever its status.

    The files come first, so an MLflow outage cannot take them with it; result.json is written
    again at the end with the time the record itself took.
    """
    record_started = time.time()
    info = summary.get("info", {})
    _finish_timing(result, started, record_started)
    _save_run_files(result, cfg, info, run_dir)
    tags = {
        STATUS_TAG: result.status,
        "ghsweep.torch_version": info.get("torch_version", _package_version("torch")),
        "ghsweep.device_name": info.get("device_name", "unknown (worker did not start)"),
    }
    tags.update({f"ghsweep.{k}": v for k, v in info.items() if k not in ("torch_version", "device_name")})
    if result.error:
        tags[ERROR_TAG] = result.error
    store.set_tags(run_id, {**tags, **profile.tags})

    points = []
    metrics_file = run_dir / "metrics.jsonl"
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            row = json.loads(line)
            points.append(("loss", row["loss"], row["step"]))
    points += [(k, v, 0) for k, v in result.metrics.items()
               if k != "first_loss" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    store.log_metrics(run_id, points)

    _finish_timing(result, started, record_started)
    store.log_metrics(run_id, [(k, v, 0) for k, v in result.timing.items()])
    _save_run_files(result, cfg, info, run_dir)
    # recipe.*: the composed NeMo recipe (backend=nemo); files a run did not write are skipped.
    artifacts = ["config.yaml", "overrides.yaml", WORKER_LOG, "report.md", "metrics.jsonl", "summary.json", "result.json",
                 "recipe.txt", "recipe.json"]
    with tempfile.TemporaryDirectory() as shown_dir:
        # config.yaml under its own name, its secrets redacted; the run directory's copy is the worker's.
        (Path(shown_dir) / "config.yaml").write_text(shown_config(cfg))
        store.log_artifacts(run_id, [Path(shown_dir) / "config.yaml"])
    store.log_artifacts(run_id, [run_dir / a for a in artifacts if a != "config.yaml"])
    store.log_artifacts(run_id, profile.artifacts, "profile")
    store.finish(run_id, result.status)
