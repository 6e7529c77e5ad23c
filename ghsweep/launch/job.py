"""One combination of a sweep: validate, train in a worker process, record in MLflow.

This is the Hydra task function's body. It never raises for a failed run inside a sweep: the
failure is recorded (MLflow status FAILED, tag `ghsweep.error`, worker log attached) and the
sweep goes on.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from hydra.core.utils import JobReturn, JobStatus, run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import ConfigError, JobTimeout, TrackingError, TrackingUriError, one_line
from ghsweep.core.failures import INFRASTRUCTURE, failure_class, out_of_memory
from ghsweep.core.gpu import probe_gpu
from ghsweep.core.run_dir import (
    ATTEMPT_LOG,
    CONFIG,
    MEASURE_AFTER,
    MEMORY_SNAPSHOT,
    METRICS,
    OVERRIDES,
    REPORT,
    SUMMARY,
    SYSTEM_METRICS,
    WORKER_ERROR,
    WORKER_LOG,
)
from ghsweep.core.run_plan import RunPlan
from ghsweep.core.run_result import WORKER_PARTS, RunResult, RunStatus
from ghsweep.core.run_summary import RunSummary
from ghsweep.launch import followups, interrupts
from ghsweep.launch.combination import Combination, run_name
from ghsweep.launch.dry_run import describe
from ghsweep.launch.provenance import code_version, input_digests
from ghsweep.launch.resume import finished_run, run_hash, skip_finished
from ghsweep.launch.run_planner import check_required, node_plan, not_runnable
from ghsweep.launch.slurm.rank_reports import wait_for_ranks, write_rank_report
from ghsweep.launch.slurm.rendezvous import export_slurm_rendezvous, slurm_task_ranks
from ghsweep.launch.slurm.requeue import earlier_start, job_ending, requeue_reason, wait_to_be_stopped
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.launch.warm_worker_client import wait_for_report
from ghsweep.launch.worker_process import WorkerExit, rank_file, run_worker
from ghsweep.profile.pipeline import ProfileOutcome, after_worker
from ghsweep.report.run_report import write_run_report
from ghsweep.tracking import records
from ghsweep.tracking.mlflow_store import MlflowStore, absolute_tracking_uri, check_tracking_uri
from ghsweep.train.system_metrics import system_points

log = logging.getLogger(__name__)

# Less free space than this under a failed run's directory: the disk was full.
FULL_DISK_BYTES = 1 << 20
# Lines of a failed worker's log read for signs of an infrastructure failure (NCCL, ECC, Xid).
LOG_TAIL_LINES = 200
# Ends the reason of an attempt that ran out of GPU memory beside the sweep's compile-ahead workers.
BESIDE_COMPILE_AHEAD = "(beside the sweep's compile-ahead workers on its GPU)"


def git_commit() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def disk_trouble(run_dir: Path) -> str | None:
    """The reason for a run whose file system is read-only or full, else None."""
    where = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # Hydra may not have made it
    stats = os.statvfs(where)
    if stats.f_flag & os.ST_RDONLY:
        return f"the file system of {run_dir} is read-only"
    free = stats.f_bavail * stats.f_frsize
    return f"no space left on device under {run_dir} ({free} bytes free)" if free < FULL_DISK_BYTES else None


def failure_reason(run_dir: Path, exit: WorkerExit, timeout_min: float | None, rank: int = 0) -> str:
    if not run_dir.is_dir():
        return f"the run directory {run_dir} was removed while the run trained"
    # A worker on a full or read-only disk cannot say so: its error file and log are cut short too.
    trouble = disk_trouble(run_dir)
    if trouble:
        return trouble
    error_file = run_dir / WORKER_ERROR
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


def resolved(cfg: DictConfig) -> dict:
    """The config as plain containers, its interpolations resolved."""
    return cast(dict, OmegaConf.to_container(cfg, resolve=True))


def shown_config(cfg: DictConfig) -> str:
    """The resolved config as records show it: secrets redacted."""
    return records.shown_config(resolved(cfg))


def write_worker_config(cfg: DictConfig, run_dir: Path) -> None:
    """config.yaml, the worker's input, with the real values; readable by the user only when it
    holds a secret (MLflow gets the redacted copy)."""
    real = OmegaConf.to_yaml(cfg, resolve=True)
    # The SLURM tasks of one run all write it, and a rank's worker may read it meanwhile.
    write_atomic(run_dir / CONFIG, real, mode=0o644 if real == shown_config(cfg) else None)


def run_one(cfg: DictConfig, combo: Combination) -> RunResult:
    """The combination `combo` of `cfg`, one not in a sweep already checked (ghsweep.__main__.main)."""
    started = time.time()
    if cfg.dry_run:
        print(
            describe(
                combo.num,
                combo.name,
                combo.run_dir,
                combo.overrides,
                cfg,
                f"in this process (hydra/launcher={combo.launcher})",
            ),
            flush=True,
        )
        result = combo.result(RunStatus.DRY_RUN)
        result.error = not_runnable(cfg, combo.run_dir, combo.name, combo.overrides)
        if result.error:
            result.status = RunStatus.NOT_RUNNABLE
        return result
    slurm_tasks = slurm_task_ranks()
    rank = export_slurm_rendezvous() if slurm_tasks and slurm_tasks > 1 else 0
    if slurm_tasks and rank > 0:  # rank > 0 only in a SLURM job of several tasks
        return run_rank(cfg, combo, rank, slurm_tasks)

    manifest = SweepManifest.of_sweep(combo.sweep_dir) if combo.in_sweep else None
    identity = run_hash(cfg)
    store: MlflowStore | None = None
    run_id: str | None = None
    restarted = earlier_start(combo.run_dir)  # SLURM requeued this job: its first start's record
    try:
        store = open_store(cfg, combo, manifest)
        earlier = finished_run(store, identity) if combo.in_sweep and not cfg.force else None
        if earlier is not None:
            return skip_finished(earlier, combo.name, combo.run_dir, combo.overrides)
        if restarted is not None and restarted.mlflow_run_id is not None:
            run_id = restarted.mlflow_run_id
            records.reopen_child_run(store, run_id)
        else:
            run_id = start_run(store, cfg, combo, identity, manifest)
    except Exception as exc:  # the store went away mid-sweep: train anyway, the run's files hold its record
        shown = str(exc) if isinstance(exc, TrackingUriError) else one_line(exc)
        if not combo.in_sweep:  # no run can be recorded: one line, not a traceback
            raise SystemExit(f"ghsweep: {shown}") from None
        log.error(
            "%s: MLflow unreachable (%s); training anyway, recorded in %s only", combo.name, shown[:300], combo.run_dir
        )
        store, run_id = None, None
    result = combo.result(RunStatus.FAILED, run_id)
    if restarted is not None:
        result.attempts = list(restarted.attempts)
        again = f"retry {len(result.attempts) + 1} of {combo.retries}, hydra.launcher.retries"
        note_retry(store, combo, result, requeue_reason(), again)
        if counted_retries(result.attempts) > combo.retries:
            result.error = (
                f"{result.attempts[-1]}: started {len(result.attempts) + 1} times, more than 1 + "
                f"hydra.launcher.retries={combo.retries}; not run again"
            )
            result.failure_class = INFRASTRUCTURE
            record(store, run_id, cfg, combo.run_dir, result, RunSummary(), ProfileOutcome(), started)
            return result
    trained = train_with_retries(cfg, combo, result, slurm_tasks, store)
    if result.status == RunStatus.RUNNING:
        log.warning(
            "%s: SLURM is ending this job (%s); its next start or the sweep records the run",
            combo.name,
            result.error,
        )
        wait_to_be_stopped()
        return result
    if result.error:
        log.error("%s: %s: %s", combo.name, result.status, result.error)

    def follow_up() -> None:
        """The profile's analysis and the record: on a local sweep, while the next combination starts."""
        profile = analyse(trained, combo, result) if trained.to_analyse else ProfileOutcome()
        record(store, run_id, cfg, combo.run_dir, result, trained.summary, profile, started)

    # The run's share of the sweep's time: its follow-up may run beside the next combination.
    result.timing["job_s"] = time.time() - started
    # The ncu pass trains on the GPU: beside no other training.
    followups.run(follow_up, alone=trained.to_analyse is not None and trained.to_analyse[1].ncu_pass is not None)
    if trained.interrupt is not None:
        raise trained.interrupt
    return result


def job_run_dir(job_cfg: DictConfig) -> Path:
    """The run directory Hydra makes for the job of `job_cfg` (absolute, as its runtime.output_dir)."""
    return Path(os.path.abspath(Path(str(job_cfg.hydra.sweep.dir), str(job_cfg.hydra.sweep.subdir))))


def refuse_linked_run_dir(job_cfg: DictConfig) -> None:
    """ConfigError for a run directory that is a symbolic link: the sweep would write wherever it points."""
    run_dir = job_run_dir(job_cfg)
    if run_dir.is_symlink():
        raise ConfigError(
            f"the run directory {run_dir} is a symbolic link (to {os.readlink(run_dir)}); a sweep writes only "
            "into directories it makes: remove the link"
        )


def record_unmade(job_cfg: DictConfig, exc: Exception) -> RunResult:
    """A combination whose job Hydra could not start (it could not make the run directory or write its
    own files there: a full or read-only disk), FAILED in MLflow with the reason; the sweep goes on."""
    hydra_cfg = job_cfg.hydra
    run_dir = job_run_dir(job_cfg)
    combo = Combination.of(hydra_cfg, run_dir, list(hydra_cfg.overrides.task), in_sweep=True)
    # Hydra's logging setup says "Unable to configure handler 'file'" for the OSError of its log file.
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    trouble = disk_trouble(run_dir) if cause is not None else None
    result = combo.result(RunStatus.FAILED)
    result.error = (
        str(exc)
        if isinstance(exc, ConfigError)
        else trouble or f"the job could not start in {run_dir}: {one_line(exc)}"
    )
    log.error("%s: %s: %s", combo.name, result.status, result.error)
    cfg = copy.deepcopy(job_cfg)  # the job's config, as Hydra would have handed it: without its `hydra` node
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    try:
        manifest = SweepManifest.of_sweep(combo.sweep_dir)
        store = open_store(cfg, combo, manifest)
        result.mlflow_run_id = start_run(store, cfg, combo, run_hash(cfg), manifest)
        records.end_run(store, result.mlflow_run_id, records.RunEnd(RunStatus.FAILED, result.error))
    except Exception as error:  # the store away too: the sweep's end names the runs MLflow lacks
        log.error("%s: not recorded in MLflow (%s)", combo.name, one_line(error)[:300])
    return result


def start_job(hydra_context: HydraContext, task_function: TaskFunction, sweep_config: DictConfig) -> JobReturn:
    """Hydra's run_job of one combination of a sweep, in whatever process its launcher runs it (the
    sweep's own, a submitit job's on its node). A job Hydra cannot start (its run directory a link, or it
    or Hydra's own files in it not written: a full or read-only disk) is recorded FAILED with what it is
    and returned as ended: raised, it would end a local sweep, and leave a submitted job's run unrecorded."""
    try:
        refuse_linked_run_dir(sweep_config)  # before Hydra writes its own files through it
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except Exception as exc:
        ret = JobReturn(overrides=list(sweep_config.hydra.overrides.task), status=JobStatus.COMPLETED)
        ret.return_value = record_unmade(sweep_config, exc).__dict__
        return ret


def open_store(cfg: DictConfig, combo: Combination, manifest: SweepManifest | None) -> MlflowStore:
    """The sweep's MLflow store (its manifest's), or the config's for a single run."""
    uri = manifest.tracking_uri if manifest else absolute_tracking_uri(cfg.tracking.uri, combo.cwd)
    return MlflowStore(uri, manifest.experiment if manifest else cfg.tracking.experiment)


def start_run(
    store: MlflowStore, cfg: DictConfig, combo: Combination, identity: str, manifest: SweepManifest | None
) -> str:
    run = records.ChildRun(
        run_name(combo, manifest.command if manifest else None),
        str(combo.run_dir),
        combo.overrides,
        combo.num,
        identity,
        manifest.parent_run_id if manifest else None,
        git_commit=git_commit(),
        code=code_version(),
        input_digests=input_digests(cfg),
    )
    run_id = records.start_child_run(store, run)
    records.log_run_config(store, run_id, combo.choices, resolved(cfg))
    return run_id


def prepare_worker(
    cfg: DictConfig, combo: Combination, slurm_tasks: int | None, measure_after: Path | None = None
) -> tuple[RunPlan, ConfigSchema]:
    """config.yaml and run_plan.json, the worker's inputs; (the plan, the typed config validation made of
    `cfg`); ConfigError for a run that cannot start here. `measure_after`: RunPlan.measure_after."""
    check_required(cfg)
    write_worker_config(cfg, combo.run_dir)
    plan, config = node_plan(cfg, combo.run_dir, combo.name, combo.overrides, probe_gpu(), slurm_tasks)
    if measure_after is not None:
        plan = dataclasses.replace(plan, measure_after=str(measure_after))
    plan.save(combo.run_dir)
    return plan, config


def timeout_s(plan: RunPlan) -> float | None:
    return plan.timeout_min * 60 if plan.timeout_min else None


@dataclass
class Trained:
    """What a run's worker left: its summary, the typed config and plan of a finished run whose
    profile is still to be analysed, and the interrupt to raise once the run is recorded."""

    summary: RunSummary = field(default_factory=RunSummary)
    to_analyse: tuple[ConfigSchema, RunPlan] | None = None
    interrupt: KeyboardInterrupt | None = None


def train_and_measure(cfg: DictConfig, combo: Combination, result: RunResult, slurm_tasks: int | None) -> Trained:
    """Rank 0: plan, run the worker, read what it measured into `result`. Never raises for a failed
    run: `result` says how it failed."""
    run_dir = combo.run_dir
    try:
        # A sweep resumed in place runs again in the directory of its interrupted attempt: that
        # attempt's outputs must not pass for this one's.
        for stale in (WORKER_ERROR, SUMMARY, METRICS, SYSTEM_METRICS, MEMORY_SNAPSHOT):
            (run_dir / stale).unlink(missing_ok=True)
        # On disk from the start: a job killed from outside leaves its MLflow run id to whoever settles it.
        dataclasses.replace(result, status=RunStatus.RUNNING).save()
        write_atomic(run_dir / OVERRIDES, OmegaConf.to_yaml(OmegaConf.create(combo.overrides)), mode=0o644)
        plan, config = prepare_worker(cfg, combo, slurm_tasks, followups.measure_after(run_dir / MEASURE_AFTER))
        # The command in the job's log: what `dry_run=true` printed for this combination, with the node's choices.
        log.info(
            "%s: training in a worker process (log: %s): %s",
            combo.name,
            run_dir / WORKER_LOG,
            shlex.join(plan.worker_command),
        )
        exit = run_worker(
            plan.worker_command,
            run_dir,
            timeout_s(plan),
            env=plan.worker_env,
            preimported=plan.preimported,
            capture=plan.capture,
        )
        summary = measure(plan, exit, result)
        return Trained(summary, (config, plan) if result.status == RunStatus.FINISHED else None)
    except (ConfigError, JobTimeout) as exc:
        result.error = str(exc)
    except Exception as exc:  # a bug, an outage or a full disk must not stop the sweep or lose the run
        failed_around_the_worker(exc, combo, result)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: run_worker has stopped the worker's process group
        result.status, result.error = RunStatus.KILLED, interrupts.reason(exc)
        return Trained(interrupt=exc)
    return Trained()


def failed_around_the_worker(exc: Exception, combo: Combination, result: RunResult) -> None:
    """`result` FAILED for `exc`, raised by ghsweep's own code around the worker (a bug, an outage, a full disk)."""
    result.status = RunStatus.FAILED
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS):
        result.error = disk_trouble(combo.run_dir) or f"{os.strerror(exc.errno)} under {combo.run_dir}: {one_line(exc)}"
    else:
        log.exception("%s: ghsweep failed around the worker", combo.name)
        result.error = one_line(exc)


def train_with_retries(
    cfg: DictConfig, combo: Combination, result: RunResult, slurm_tasks: int | None, store: MlflowStore | None
) -> Trained:
    """train_and_measure, and again after an infrastructure failure, up to `combo.retries` times, in
    the same run directory and MLflow run: each failed attempt's reason is kept (result.attempts, tag
    ghsweep.attempt.N) and its worker log (worker.attemptN.log). A failed run's class is in
    result.failure_class. A SLURM job of several tasks is not retried here: its other ranks have ended.

    A worker killed from outside in a SLURM job that SLURM is ending (cancelled, requeued, preempted,
    its node lost) is no failure of the run: `result` comes back RUNNING, for the job's next start or
    the sweep's settling to record.

    A run that ran out of GPU memory while the sweep's compile-ahead workers trained beside it is
    run again once, after they have ended, whatever `combo.retries` says: that memory was the sweep's."""
    while True:
        attempt_started = time.time()
        trained = train_and_measure(cfg, combo, result, slurm_tasks)
        if result.status == RunStatus.FINISHED or trained.interrupt is not None or not result.error:
            return trained
        result.failure_class = failure_class(result.error, log_tail(combo.run_dir / WORKER_LOG))
        crowded = out_of_memory(result.error) and followups.gpu_shared_since(attempt_started)
        if crowded and not any(reason.endswith(BESIDE_COMPILE_AHEAD) for reason in result.attempts):
            note_retry(store, combo, result, f"{result.error} {BESIDE_COMPILE_AHEAD}", "alone, once they have ended")
            followups.wait_for_gpu()
            continue
        if result.failure_class == INFRASTRUCTURE and slurm_tasks is not None:
            ending = job_ending()
            if ending:
                result.status, result.error = RunStatus.RUNNING, f"SLURM job state {ending}; the worker: {result.error}"
                return trained
        retried = counted_retries(result.attempts)
        if result.failure_class != INFRASTRUCTURE or retried >= combo.retries or (slurm_tasks or 1) > 1:
            return trained
        note_retry(
            store, combo, result, str(result.error), f"retry {retried + 1} of {combo.retries}, hydra.launcher.retries"
        )


def counted_retries(attempts: list[str]) -> int:
    """The earlier attempts that hydra.launcher.retries counts: all but one run again beside compile-ahead."""
    return sum(not reason.endswith(BESIDE_COMPILE_AHEAD) for reason in attempts)


def log_tail(path: Path) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])


def note_retry(store: MlflowStore | None, combo: Combination, result: RunResult, reason: str, again: str) -> None:
    """Record why the last attempt failed (`reason`), keep its worker log, and clear `result` for the
    next attempt, which the log says how it runs (`again`)."""
    attempt = len(result.attempts) + 1
    log.warning(
        "%s: attempt %d failed for its infrastructure (%s); running it again (%s)", combo.name, attempt, reason, again
    )
    worker_log = combo.run_dir / WORKER_LOG
    if worker_log.exists():
        worker_log.replace(combo.run_dir / ATTEMPT_LOG.format(n=attempt))
    result.attempts.append(reason)
    if store is not None and result.mlflow_run_id is not None:
        try:  # on the run while it trains again; a store away now still gets it at the record
            records.record_attempts(store, result.mlflow_run_id, result.attempts)
        except Exception as exc:
            log.error("%s: MLflow did not take attempt %d's reason (%s)", combo.name, attempt, one_line(exc)[:300])
    result.status, result.error, result.failure_class, result.metrics = RunStatus.FAILED, None, None, {}


def measure(plan: RunPlan, exit: WorkerExit, result: RunResult) -> RunSummary:
    """How the worker ended, into `result`; a finished one's summary."""
    run_dir = Path(plan.run_dir)
    other_ranks_error = wait_for_ranks(run_dir, plan.world.size) if plan.srun_ranks else None
    if exit.returncode != 0:
        result.error = failure_reason(run_dir, exit, plan.timeout_min)
        return RunSummary()
    if other_ranks_error:
        result.error = other_ranks_error
        return RunSummary()
    summary = RunSummary.load(run_dir)
    result.status = RunStatus.FINISHED
    result.metrics = summary.metrics
    train = summary.timing
    result.timing = {
        "startup_s": train["ready_at"] - exit.started_at + train["import_s"],
        "setup_s": train["setup_s"],
        "train_s": train["train_s"],
        # From the loop's end to the worker's exit: the summary, and nsys stopping and writing its report.
        "worker_exit_s": exit.started_at + exit.wall_s - train["setup_at"] - train["setup_s"] - train["train_s"],
        **{k: train[k] for k in WORKER_PARTS if k in train},
    }
    return summary


def analyse(trained: Trained, combo: Combination, result: RunResult) -> ProfileOutcome:
    """The profile of a finished run: export, analysis, the ncu pass, the profile report and its plots,
    their metrics into `result`. A failure here fails the run, as one around its worker does."""
    assert trained.to_analyse is not None
    config, plan = trained.to_analyse
    analysis_started = time.time()
    try:
        wait_for_report(Path(plan.run_dir))  # a handed collection's report is written after its worker
        # The ncu pass reruns a short worker in a subfolder, under ncu in place of nsys: its plan's command.
        profile = after_worker(
            config,
            plan,
            lambda command, work: run_worker(command, work, timeout_s(plan), env=plan.worker_env).returncode,
        )
    except Exception as exc:
        failed_around_the_worker(exc, combo, result)
        return ProfileOutcome()
    result.timing["analysis_s"] = time.time() - analysis_started
    result.metrics.update(profile.metrics)
    return profile


def run_rank(cfg: DictConfig, combo: Combination, rank: int, slurm_tasks: int) -> RunResult:
    """A SLURM task of rank > 0: train this rank and say how it ended in rankN.json; rank 0's task
    records the run (MLflow, profile analysis over every rank's report)."""
    result = combo.result(RunStatus.FAILED)
    try:
        plan, _ = prepare_worker(cfg, combo, slurm_tasks)
        log.info(
            "%s: rank %d training in a worker process (log: %s): %s",
            result.name,
            rank,
            combo.run_dir / rank_file(WORKER_LOG, rank),
            shlex.join(plan.worker_command),
        )
        exit = run_worker(plan.worker_command, combo.run_dir, timeout_s(plan), rank, plan.worker_env)
        if exit.returncode == 0:
            result.status = RunStatus.FINISHED
        else:
            result.error = failure_reason(combo.run_dir, exit, plan.timeout_min, rank)
    except Exception as exc:  # whatever stops this rank, rank 0 must hear of it rather than wait
        result.error = str(exc) if isinstance(exc, ConfigError) else one_line(exc)
    write_rank_report(combo.run_dir, rank, result.status, result.error)
    return result


def _finish_timing(result: RunResult, started: float, record_started: float) -> None:
    result.timing["record_s"] = time.time() - record_started
    result.timing["wall_s"] = time.time() - started
    if "train_s" in result.timing:
        result.timing["overhead_s"] = result.timing["wall_s"] - result.timing["train_s"]


def _save_run_files(result: RunResult, asked: dict, info: dict, run_dir: Path) -> None:
    """report.md and result.json. A full disk is logged, not raised: MLflow still gets the record."""
    try:
        write_run_report(result, asked, info, run_dir / REPORT)
        result.save()
    except OSError as exc:
        log.error("%s: the run's files could not be written in %s: %s", result.name, run_dir, exc)


def loss_points(metrics_file: Path) -> list[tuple[str, float, int]]:
    """("loss", value, step) of each line of metrics.jsonl; a line cut short (the worker killed as it
    wrote it) is left out, not allowed to lose the rest of the record."""
    if not metrics_file.exists():
        return []
    points = []
    for line_no, line in enumerate(metrics_file.read_text(errors="replace").splitlines(), 1):
        try:
            row = json.loads(line)
            points.append(("loss", float(row["loss"]), int(row["step"])))
        except (ValueError, TypeError, KeyError):
            log.warning("%s: line %d is not a whole step record (cut short?); left out", metrics_file, line_no)
    return points


def record(
    store: MlflowStore | None,
    run_id: str | None,
    cfg: DictConfig,
    run_dir: Path,
    result: RunResult,
    summary: RunSummary,
    profile: ProfileOutcome,
    started: float,
) -> None:
    """Report, result.json and MLflow: everything the run measured, whatever its status.

    The files come first, so an MLflow outage cannot take them with it; result.json is written
    again at the end with the time the record itself took. A failure here is logged, not raised.
    Without a store (it was unreachable when the run started) the files are the whole record; a store
    that stopped answering during the run is found out in seconds, before MLflow's minutes of retries.
    """
    try:
        record_started = time.time()
        info, asked = summary.info, resolved(cfg)
        _finish_timing(result, started, record_started)
        _save_run_files(result, asked, info, run_dir)
        if store is None or run_id is None:
            return
        check_tracking_uri(store.tracking_uri)
        outcome = records.RunOutcome(
            result.status,
            result.error,
            result.failure_class,
            result.attempts,
            info,
            profile.tags,
            result.metrics,
            loss_points(run_dir / METRICS),
            # GPU and host over time, also for a run that failed (an OOM's memory and power up to it).
            system_points(run_dir),
        )
        records.record_outcome(store, run_id, outcome)

        _finish_timing(result, started, record_started)
        _save_run_files(result, asked, info, run_dir)
        close = records.RunClose(result.status, result.timing, asked, run_dir, len(result.attempts), profile.artifacts)
        records.close_run(store, run_id, close)
    except Exception as exc:  # MLflow unreachable even after retries: the run's own files hold the record
        log.error(
            "%s: the MLflow record is incomplete (%s); the run's record is complete in %s",
            result.name,
            one_line(exc)[:300],
            run_dir,
        )
        # A store that is gone is not asked again (its retries take minutes): the sweep's end settles the run.
        if store is not None and run_id is not None and not isinstance(exc, (TrackingUriError, TrackingError)):
            _end_anyway(store, run_id, result)


def _end_anyway(store: MlflowStore, run_id: str, result: RunResult) -> None:
    """End the run with its status though its record broke off (its run directory removed under it, an
    artifact gone): a run left RUNNING would pass for one still training."""
    try:
        records.end_run(store, run_id, records.RunEnd(result.status, result.error))
    except Exception as exc:  # the store failed after all: the sweep's end, or the next sweep, settles it
        log.error("%s: could not be ended in MLflow (%s)", run_id, one_line(exc)[:300])
