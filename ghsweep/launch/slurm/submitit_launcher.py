"""Hydra's submitit launchers (hydra-submitit-launcher), made to never lose a run.

The plugin's launch() submits the sweep and then waits on each job's result, so one job cancelled
from outside raises and ends the whole sweep, and its MLflow run stays RUNNING forever. These
subclasses keep the plugin's config keys, and change launch() and the remote side (its __call__, run_submitted):
- dry_run=true prints each combination's run directory, worker command and sbatch parameters and
  submits nothing;
- combinations that already FINISHED in MLflow are not submitted again (force=true: all are);
- every submitted job is recorded in the sweep directory; with wait=true the sweep waits for all
  of them and collects each one's result (ghsweep.launch.slurm.submitted_jobs), with wait=false it returns at
  once and `python -m ghsweep.status SWEEP_DIR` follows and collects it later;
- each job starts its combination as the local launcher does (ghsweep.launch.job.start_job): a job
  Hydra cannot start (its run directory a link, a full or read-only disk) is recorded FAILED with what
  it is, and the sweep collects what the job returned.
Hydra instantiates launchers only from the hydra_plugins package: the classes profiles name
(`hydra_plugins.ghsweep_launcher.ghsweep_launcher.SlurmLauncher`, `...LocalLauncher`) are the
plugin's, with launch(), checkpoint() and __call__ calling this module's (imported when called: Hydra imports
hydra_plugins at every command's plugin scan).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, cast

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, setup_globals
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict
from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string

from ghsweep.config.parallelism import world_of
from ghsweep.config.schema import typed
from ghsweep.core.errors import JobTimeout
from ghsweep.core.run_plan import World
from ghsweep.core.run_result import RunResult
from ghsweep.launch.combination import Combination
from ghsweep.launch.dry_run import describe, local_ranks_text
from ghsweep.launch.job import start_job
from ghsweep.launch.local_gpus import gpu_sets, placed_gpus
from ghsweep.launch.resume import finished_run, run_hash, skip_finished
from ghsweep.launch.slurm.requeue import slurm_job_id
from ghsweep.launch.slurm.submitted_jobs import SubmittedJob, collect_results, has_ended, save_jobs, wait_until_ended
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import MlflowStore

log = logging.getLogger(__name__)

# SLURM signals the time limit up to a minute early (its event resolution): a signal further ahead
# than signal_delay_s plus this came from outside.
TIME_LIMIT_SLACK_S = 90


def time_left_s() -> float:
    """Seconds until this SLURM job's time limit (its EndTime, from squeue); 0 when unknown."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return 0.0
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%e"], capture_output=True, text=True, timeout=30)
        return datetime.fromisoformat(out.stdout.strip()).timestamp() - time.time()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0.0


class _ScriptOnlySlurm(SlurmExecutor):
    """submitit's SLURM executor where SLURM is not installed, for a dry run (a cluster sweep previewed
    from a laptop): it builds the sbatch script and submits nothing. submitit's own refuses to start
    without srun."""

    @classmethod
    def affinity(cls) -> int:
        return 1


class _ScriptOnlyExecutor(submitit.AutoExecutor):
    """An AutoExecutor for SLURM over _ScriptOnlySlurm: the same parameter names and script, no submitting."""

    def __init__(self, folder: str | Path, **slurm_init: Any) -> None:
        self.cluster = "slurm"
        self._executor = _ScriptOnlySlurm(folder, **slurm_init)
        self._deprecated_args = {}
        submitit.core.core.Executor.__init__(self, self._executor.folder, self._executor.parameters)


@dataclass(frozen=True)
class _Composed:
    """A combination the launcher composed to submit: the Combination its job will read from the
    same config, and what submitting it needs besides."""

    combo: Combination
    overrides: list[str]  # the real values: what the job composes its config from
    cfg: DictConfig  # the combination's config, its `hydra` node included
    # The job array it goes in (config.parallelism.world_of of the config as composed: no job, so no plan or
    # validated config, exists yet).
    world: World
    run_hash: str  # launch.resume.run_hash of `cfg`, as the job records it


def _compose(
    launcher: plugin.BaseSubmititLauncher, config: DictConfig, overrides: Sequence[str], num: int
) -> _Composed:
    """Job `num` of the sweep as its job will compose it from `overrides`."""
    assert launcher.hydra_context is not None  # set by the launcher's setup(), before launch()
    cfg = launcher.hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(cfg.hydra.job):
        cfg.hydra.job.num = num
    # The run directory run_job will use in the job: sweep.dir/subdir, relative to the submit directory.
    run_dir = Path(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir)).absolute()
    combo = Combination.of(cfg.hydra, run_dir, list(overrides), in_sweep=True)
    return _Composed(combo, list(overrides), cfg, world_of(typed(cfg)), run_hash(cfg))


def checkpoint(launcher: plugin.BaseSubmititLauncher) -> NoReturn:
    """Called in the job when SLURM signals it (submitit's checkpointing): at its time limit, or
    from outside before the limit (a preemption notice, `scancel --signal=USR2`).

    Signalled from outside, the job is requeued (`scontrol requeue`, as submitit's own requeue does)
    and this process exits; the job starts again from its submitted pickle, in the same run
    directory, continuing its MLflow run (ghsweep.launch.slurm.requeue); benchmark runs are short, so
    starting over is right. At the time limit it is not: a restart from scratch would reach the same
    limit, and no backend resumes from a checkpoint, so the run ends now and is recorded as timed out.

    The job is requeued here rather than by returning the plugin's checkpoint to submitit: submitit
    takes any signal in a job's last 10 minutes (or last 20%) for its time limit, and with the
    plugin's max_num_timeout=0 refuses to requeue after one ("Job not requeued because: timed-out
    too many times"), so a job signalled in its last 10 minutes, which is any time for a limit of
    10 minutes (the test cluster's), was never requeued. squeue's EndTime says which signal this is.
    """
    assert launcher.config is not None  # set by the launcher's setup(), before it was submitted
    left_s = time_left_s()
    if left_s > launcher.params["signal_delay_s"] + TIME_LIMIT_SLACK_S:
        log.warning("signalled %.0f s before the time limit: requeueing the job", left_s)
        subprocess.run(["scontrol", "requeue", str(slurm_job_id())], check=True, timeout=60)
        # As submitit ends a job it requeued: the worker is stopped on the way out (run_worker), and
        # the result.json left RUNNING gives the next start this run's MLflow run.
        sys.exit(-1)
    raise JobTimeout(
        f"timed out: the SLURM time limit ({launcher.params['timeout_min']} min, hydra.launcher.timeout_min) "
        f"was reached; backend {launcher.config.backend.name} cannot resume from a checkpoint, so the job "
        "was not requeued"
    )


def run_submitted(
    launcher: plugin.BaseSubmititLauncher,
    sweep_overrides: Sequence[str],
    job_num: int,
    singleton_state: dict[type, Singleton],
) -> JobReturn:
    """The remote side of a submitted job (the plugin's __call__, in the job on its node): its combination
    composed as the plugin composes it, and started as a local sweep starts one (launch.job.start_job),
    so a job Hydra cannot start is recorded FAILED with what it is rather than a traceback in its SLURM log."""
    assert launcher.hydra_context is not None and launcher.config is not None and launcher.task_function is not None
    Singleton.set_state(singleton_state)
    setup_globals()
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(sweep_overrides))
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.id = submitit.JobEnvironment().job_id
        sweep_config.hydra.job.num = job_num
    return start_job(launcher.hydra_context, launcher.task_function, sweep_config)


# The launcher keys hydra-submitit-launcher passes to the executor's constructor (as
# `{cluster}_{key}`) rather than to update_parameters.
PLUGIN_INIT_KEYS = {"max_num_timeout"}


def make_executor(cluster: str, params: Mapping[str, Any], world: World, dry_run: bool) -> submitit.AutoExecutor:
    """The submitit executor of one job array: `params` are the launcher's keys (hydra.launcher,
    resolved), `cluster` the plugin's executor kind (local or slurm).

    hydra-submitit-launcher builds its executor inside launch(), which then submits and waits, so
    there is no function of its to call: this is that code (tests/launch/test_executor.py holds
    the two to the same parameters), with ghsweep's additions: a SLURM job array of `world` (one
    task per GPU on each node), `retries` left out (each job reads it), and a dry run where SLURM
    is not installed building the sbatch script without submitit's check for srun.
    """
    params = {k: v for k, v in params.items() if k != "retries"}
    if cluster == "slurm" and world.size > 1:
        # srun starts one task per GPU on each node. GPUs are asked for where the profile asks for any
        # (a CPU cluster's profile asks for none, and its tasks train with gloo).
        params.update(nodes=world.num_nodes, tasks_per_node=world.gpus_per_node)
        if params.get("gpus_per_node"):
            params["gpus_per_node"] = world.gpus_per_node
    folder = params.pop("submitit_folder")
    init = {k: params.pop(k) for k in PLUGIN_INIT_KEYS & params.keys()}
    if cluster == "slurm" and dry_run and shutil.which("srun") is None:
        executor: submitit.AutoExecutor = _ScriptOnlyExecutor(folder, **init)
    else:
        executor = submitit.AutoExecutor(
            cluster=cluster, folder=folder, **{f"{cluster}_{k}": v for k, v in init.items()}
        )
    generic = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in generic else f"{cluster}_{k}": v for k, v in params.items()})
    return executor


def sbatch_script(executor: submitit.AutoExecutor, count: int) -> list[str]:
    """The batch script submitit submits for a job array of `count` jobs: its #SBATCH lines and srun line."""
    slurm_executor = cast(SlurmExecutor, executor._executor)  # AutoExecutor(cluster="slurm") holds one
    return _make_sbatch_string(
        command=slurm_executor._submitit_command_str,
        folder=executor.folder,
        map_count=count,
        **executor._executor.parameters,
    ).splitlines()


def _launch_description(
    executor: submitit.AutoExecutor, cluster: str, count: int, world: World
) -> tuple[str, str | None]:
    """(the launch line, the ranks line of a run on several GPUs or None)."""
    parameters = executor._executor.parameters
    if cluster != "slurm":
        return f"submitit {cluster} job with {parameters}", local_ranks_text(world)
    script = sbatch_script(executor, count)
    sbatch = "sbatch " + " ".join(line.removeprefix("#SBATCH ") for line in script if line.startswith("#SBATCH"))
    if world.size == 1:
        return sbatch, None
    srun = next(line for line in script if line.startswith("srun "))
    return sbatch, (
        f"{world.num_nodes} node(s) x {world.gpus_per_node} tasks = {world.size} ranks, one per GPU, "
        f"started by `{srun}`; each task runs the worker line with RANK, LOCAL_RANK, WORLD_SIZE, "
        "MASTER_ADDR (the first node) and MASTER_PORT from SLURM's environment"
    )


def launch(
    launcher: plugin.BaseSubmititLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Sequence[JobReturn]:
    """The launch() of ghsweep's submitit launchers (see the module's docstring)."""
    cfg = launcher.config
    assert cfg is not None  # set by the launcher's setup(), before launch()
    cluster = launcher._EXECUTOR
    sweep_dir = Path(str(cfg.hydra.sweep.dir))
    combos = [_compose(launcher, cfg, o, initial_job_idx + i) for i, o in enumerate(job_overrides)]
    # One job array per world: a SLURM array has one set of nodes and tasks for all its jobs.
    worlds = {c.world: make_executor(cluster, launcher.params, c.world, cfg.dry_run) for c in combos}
    slurm = cluster == "slurm"
    # A local sweep on GPUs places each combination on GPUs of its own (precheck made sure each fits);
    # without any, all run at once.
    gpus = placed_gpus(cfg)

    if cfg.dry_run:
        for c in combos:
            launch, ranks = _launch_description(
                worlds[c.world], cluster, sum(d.world == c.world for d in combos), c.world
            )
            if gpus:
                sets = " or ".join(",".join(map(str, s)) for s in gpu_sets(gpus, c.world.size))
                launch += (
                    f"; on GPUs of its own (its job's CUDA_VISIBLE_DEVICES): {sets}, one combination per set at once"
                )
            print(
                describe(
                    c.combo.num,
                    c.combo.name,
                    c.combo.run_dir,
                    c.combo.overrides,
                    c.cfg,
                    launch,
                    ranks,
                    on_slurm=slurm,
                ),
                flush=True,
            )
        if slurm:  # each job array's script as sbatch gets it, line for line
            for world, executor in worlds.items():
                count = sum(c.world == world for c in combos)
                script = "\n".join(f"    {line}".rstrip() for line in sbatch_script(executor, count))
                print(redact.text(f"batch script of the job array of {count} combination(s):\n{script}"), flush=True)
        print(f"ghsweep: dry run, {len(combos)} combinations; nothing was submitted", flush=True)
        return [_job_return(c, None) for c in combos]

    if "mode" in cfg.hydra.sweep:  # as hydra-submitit-launcher does: the sweep directory's permissions
        os.chmod(sweep_dir, int(str(cfg.hydra.sweep.mode), 8))
    manifest = SweepManifest.require(sweep_dir)
    store = MlflowStore(manifest.tracking_uri, manifest.experiment)
    done: dict[int, RunResult] = {}
    for c in combos:
        earlier = None if cfg.force else finished_run(store, c.run_hash)
        if earlier is not None:
            done[c.combo.num] = skip_finished(earlier, c.combo.name, c.combo.run_dir, c.combo.overrides)
    to_submit = [c for c in combos if c.combo.num not in done]
    if done:
        print(
            f"ghsweep: resume: {len(done)} of {len(combos)} combinations already FINISHED in MLflow "
            f"with the same config, code and input files are skipped (force=true reruns them)",
            flush=True,
        )

    jobs: list[tuple[SubmittedJob, submitit.Job]] = []
    if to_submit:
        for c in to_submit:
            log.info("\t#%d : %s", c.combo.num, " ".join(filter_overrides(c.overrides)))
        if gpus:
            jobs = _submit_on_gpus(launcher, worlds, to_submit, gpus, sweep_dir)
        else:
            jobs = _submit_arrays(launcher, worlds, to_submit, sweep_dir)
        jobs.sort(key=lambda pair: pair[0].num)
        print(
            f"ghsweep: submitted {len(jobs)} jobs ({cluster}): {', '.join(s.job_id for s, _ in jobs)}",
            flush=True,
        )

    if not cfg.wait:
        print(
            f"ghsweep: not waiting (wait=false); follow and collect the sweep with\n"
            f"  python -m ghsweep.status {shlex.quote(str(sweep_dir))}",
            flush=True,
        )
        return [_job_return(c, done.get(c.combo.num)) for c in combos]
    wait_until_ended([j for _, j in jobs], poll_s=2.0)
    done.update((s.num, r) for (s, _), r in zip(jobs, collect_results(sweep_dir, jobs)))
    return [_job_return(c, done[c.combo.num]) for c in combos]


def _submitted(c: _Composed, job: submitit.Job) -> SubmittedJob:
    return SubmittedJob(
        job_id=job.job_id,
        num=c.combo.num,
        name=c.combo.name,
        run_dir=str(c.combo.run_dir),
        overrides=c.combo.overrides,
        run_hash=c.run_hash,
        folder=str(job.paths.folder),
        stdout=str(job.paths.stdout),
        stderr=str(job.paths.stderr),
    )


def _submit_arrays(
    launcher: plugin.BaseSubmititLauncher,
    worlds: dict[World, submitit.AutoExecutor],
    combos: list[_Composed],
    sweep_dir: Path,
) -> list[tuple[SubmittedJob, submitit.Job]]:
    """Submit `combos` at once, one job array per world (SLURM's arrays; local jobs on the CPU)."""
    pairs: list[tuple[SubmittedJob, submitit.Job]] = []
    for world, executor in worlds.items():
        group = [c for c in combos if c.world == world]
        if not group:
            continue
        submitted = executor.map_array(
            launcher,
            [c.overrides for c in group],
            ["hydra.sweep.dir"] * len(group),
            [c.combo.num for c in group],
            [f"job_id_for_{c.combo.num}" for c in group],
            [Singleton.get_state()] * len(group),
        )
        pairs += [(_submitted(c, j), j) for c, j in zip(group, submitted)]
    save_jobs(sweep_dir, [s for s, _ in pairs])
    return pairs


def _submit_on_gpus(
    launcher: plugin.BaseSubmititLauncher,
    worlds: dict[World, submitit.AutoExecutor],
    combos: list[_Composed],
    gpus: list[int],
    sweep_dir: Path,
) -> list[tuple[SubmittedJob, submitit.Job]]:
    """Submit `combos` in order as local jobs, each on GPUs of its own (a set of gpu_sets for its
    world), the next one as soon as GPUs it fits on are free; returns when the last one is submitted.
    Each job is recorded as it starts, so an interrupted sweep's record (and `ghsweep.status`) holds
    every job that ran."""
    running: list[tuple[tuple[int, ...], submitit.Job]] = []
    pairs: list[tuple[SubmittedJob, submitit.Job]] = []
    for c in combos:
        while True:
            running = [(used, job) for used, job in running if not has_ended(job)]
            busy = {gpu for used, _ in running for gpu in used}
            free = [s for s in gpu_sets(gpus, c.world.size) if busy.isdisjoint(s)]
            if free:
                break
            time.sleep(1.0)
        executor = worlds[c.world]
        # submitit's local executor gives a job CUDA_VISIBLE_DEVICES from these (AutoExecutor has no name for them).
        executor.update_parameters(gpus_per_node=len(free[0]))
        executor._executor.update_parameters(visible_gpus=free[0])
        job = executor.submit(
            launcher,
            c.overrides,
            "hydra.sweep.dir",
            c.combo.num,
            f"job_id_for_{c.combo.num}",
            Singleton.get_state(),
        )
        running.append((free[0], job))
        pairs.append((_submitted(c, job), job))
        save_jobs(sweep_dir, [pairs[-1][0]])
        print(f"ghsweep: #{c.combo.num} {c.combo.name} started on GPU {','.join(map(str, free[0]))}", flush=True)
    return pairs


def _job_return(c: _Composed, result: RunResult | None) -> JobReturn:
    # COMPLETED even for a failed run: the failure is recorded, and Hydra's sweeper would
    # otherwise raise on it and end the sweep before its summary.
    ret = JobReturn(overrides=c.overrides, status=JobStatus.COMPLETED, task_name=c.combo.name)
    ret.return_value = result.__dict__ if result else None
    return ret
