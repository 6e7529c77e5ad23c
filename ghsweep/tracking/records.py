"""Every MLflow record ghsweep writes, from the typed records its callers build.

Callers say what happened (a combination's run started, was retried, measured, ended; a sweep
started, counted its runs, ended; a study or a comparison answered); this module says how MLflow
holds it: which tags, params, metrics and artifact folders, and what is redacted. MlflowStore
(mlflow_store.py) talks to MLflow, and redacts every value it is given.
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from ghsweep.core.errors import TrackingError
from ghsweep.core.failures import INFRASTRUCTURE
from ghsweep.core.names import (
    ATTEMPTS_TAG,
    CODE_TAG,
    ERROR_TAG,
    FAILURE_CLASS_TAG,
    HOST_TAG,
    INPUTS_TAG,
    JOB_NUM_TAG,
    NOTE_TAG,
    OVERRIDES_TAG,
    ROLE_RUN,
    ROLE_SWEEP,
    RUN_DIR_TAG,
    RUN_HASH_TAG,
    RUN_IDS_TAG,
    STATUS_TAG,
    STUDY_TAG,
    SWEEP_DIR_TAG,
    TRIAL_TAG,
    attempt_tag,
    join_overrides,
)
from ghsweep.core.run_dir import ARTIFACTS, ATTEMPT_LOG, COMPARISON_DIR, CONFIG, TUNE_DIR
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import PARENT_TAG, MlflowStore, flatten

GIT_COMMIT_TAG = "mlflow.source.git.commit"
# MLflow's limit on a tag value.
MAX_TAG_CHARS = 8000
# What a run's worker reports that has a tag of its own, with what the tag says when it reported nothing.
TORCH_VERSION, DEVICE_NAME = "torch_version", "device_name"
NO_DEVICE = "unknown (worker did not start)"


# A combination's run.


@dataclass(frozen=True)
class ChildRun:
    """A combination's run as it starts: by its job, or by the sweep for a job that died before it could."""

    name: str
    run_dir: str
    overrides: list[str]
    job_num: int  # the sweep's combination order; run start times are not, with parallel launchers
    run_hash: str  # its identity, for resume
    parent_run_id: str | None
    # The job's own account of its code and input files (launch.provenance); the sweep has none of a job that died.
    git_commit: str | None = None
    code: str | None = None
    input_digests: Mapping[str, str] | None = None


def child_run_tags(run: ChildRun) -> dict[str, str]:
    """The tags a combination's run starts with."""
    tags = {RUN_DIR_TAG: run.run_dir, OVERRIDES_TAG: join_overrides(run.overrides)}
    if run.git_commit is not None:
        tags[GIT_COMMIT_TAG] = run.git_commit
    tags |= {HOST_TAG: socket.gethostname(), RUN_HASH_TAG: run.run_hash}
    if run.code is not None:
        tags[CODE_TAG] = run.code
    if run.input_digests is not None:
        tags[INPUTS_TAG] = json.dumps(dict(run.input_digests), sort_keys=True)
    tags[JOB_NUM_TAG] = str(run.job_num)
    return tags


def start_child_run(store: MlflowStore, run: ChildRun) -> str:
    """A RUNNING run of one combination, under its sweep's run where it has one; its id."""
    return store.start_run(run.name, ROLE_RUN, child_run_tags(run), parent_run_id=run.parent_run_id)


def reopen_child_run(store: MlflowStore, run_id: str) -> None:
    """A run that an earlier attempt of its job ended, RUNNING again for the attempt that goes on with it
    (a SLURM job requeued)."""
    store.reopen(run_id)


def shown_config(resolved: Mapping[str, Any]) -> str:
    """A resolved config (plain containers) as records show it: YAML, secrets redacted."""
    return OmegaConf.to_yaml(OmegaConf.create(redact.config(resolved)))


def log_run_config(store: MlflowStore, run_id: str, choices: Mapping[str, str], resolved: Mapping[str, Any]) -> None:
    """A combination's params: its config groups' choices and every knob of its resolved config."""
    store.log_params(run_id, {**choices, **flatten(redact.config(resolved))})


def attempt_tags(attempts: Sequence[str]) -> dict[str, object]:
    """The tags of a run whose earlier attempts failed for `attempts` (their reasons, in order)."""
    tags: dict[str, object] = {attempt_tag(n): f"{INFRASTRUCTURE}: {why}" for n, why in enumerate(attempts, 1)}
    tags[ATTEMPTS_TAG] = len(attempts) + 1
    return tags


def record_attempts(store: MlflowStore, run_id: str, attempts: Sequence[str]) -> None:
    """Why each earlier attempt of a run that trains again failed."""
    store.set_tags(run_id, attempt_tags(attempts))


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class RunOutcome:
    """How a combination's run ended and what it measured: its record's tags and metrics."""

    status: RunStatus
    error: str | None
    failure_class: str | None
    attempts: list[str]  # why each earlier attempt failed
    info: Mapping[str, Any]  # what the worker reported of itself (RunSummary.info)
    profile_tags: Mapping[str, object]
    metrics: Mapping[str, Any]  # RunResult.metrics
    loss: Sequence[tuple[str, float, int]]  # (name, value, step) of each step
    system: Sequence[tuple[str, float, int, int]]  # GPU and host over time: (name, value, step, time in ms)


def record_outcome(store: MlflowStore, run_id: str, outcome: RunOutcome) -> None:
    info = outcome.info
    tags: dict[str, object] = {
        STATUS_TAG: outcome.status,
        f"ghsweep.{TORCH_VERSION}": info.get(TORCH_VERSION, package_version("torch")),
        f"ghsweep.{DEVICE_NAME}": info.get(DEVICE_NAME, NO_DEVICE),
    }
    tags.update({f"ghsweep.{k}": v for k, v in info.items() if k not in (TORCH_VERSION, DEVICE_NAME)})
    if outcome.error:
        tags[ERROR_TAG] = outcome.error
    if outcome.failure_class:
        tags[FAILURE_CLASS_TAG] = outcome.failure_class
    tags.update(attempt_tags(outcome.attempts))
    store.set_tags(run_id, {**tags, **outcome.profile_tags})
    points = [*outcome.loss]
    points += [
        (k, v, 0)
        for k, v in outcome.metrics.items()
        if k != "first_loss" and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    store.log_metrics(run_id, points)
    store.log_metric_series(run_id, outcome.system)


@dataclass(frozen=True)
class RunClose:
    """The last of a combination's record, after its outcome: the time each part took, its files, its status."""

    status: RunStatus
    timing: Mapping[str, float]
    config: Mapping[str, Any]  # resolved, plain containers
    run_dir: Path
    attempts: int  # how many earlier attempts left a worker log
    profile_artifacts: Sequence[Path] = ()


def close_run(store: MlflowStore, run_id: str, close: RunClose) -> None:
    store.log_metrics(run_id, [(k, v, 0) for k, v in close.timing.items()])
    with tempfile.TemporaryDirectory() as shown_dir:
        # config.yaml under its own name, its secrets redacted; the run directory's copy is the worker's.
        (Path(shown_dir) / CONFIG).write_text(shown_config(close.config))
        store.log_artifacts(run_id, [Path(shown_dir) / CONFIG])
    # recipe.*: the composed NeMo recipe (backend=nemo); files a run did not write are skipped.
    store.log_artifacts(run_id, [close.run_dir / a for a in ARTIFACTS if a != CONFIG])
    store.log_artifacts(run_id, [close.run_dir / ATTEMPT_LOG.format(n=n) for n in range(1, close.attempts + 1)])
    store.log_artifacts(run_id, close.profile_artifacts, "profile")
    store.finish(run_id, close.status)


@dataclass(frozen=True)
class RunEnd:
    """A run ended without the rest of its record: its status, and why where it did not finish."""

    status: RunStatus
    error: str | None = None
    failure_class: str | None = None
    slurm_job_id: str | None = None  # the job of a run that the sweep ended for SLURM's account of it
    logs: Sequence[Path] = field(default_factory=tuple)  # attached before it ends; ones not written are skipped


def end_run(store: MlflowStore, run_id: str, end: RunEnd) -> None:
    store.log_artifacts(run_id, end.logs)
    if not end.error:
        store.finish(run_id, end.status)
        return
    tags: dict[str, object] = {"ghsweep.slurm_job_id": end.slurm_job_id} if end.slurm_job_id is not None else {}
    if end.failure_class:
        tags[FAILURE_CLASS_TAG] = end.failure_class
    store.end_run(run_id, end.status, end.error, tags)


def record_slurm_logs(store: MlflowStore, run_id: str, stdout: Path, stderr: Path) -> None:
    """The SLURM job's own output, of a run that did not finish."""
    store.log_artifacts(run_id, [stdout, stderr], "slurm")


def record_from_run_dir(
    store: MlflowStore,
    result: RunResult,
    loss: Sequence[tuple[str, float, int]],
    system: Sequence[tuple[str, float, int, int]] = (),
    tags: Mapping[str, str] | None = None,
) -> None:
    """A run that ended on disk while its MLflow run stayed RUNNING: its end, metrics and files from its
    run directory (`loss`: its steps' losses; `system`: GPU and host over time, as RunOutcome's; `tags`:
    more to say of it)."""
    run_id = str(result.mlflow_run_id)
    numbers = {**result.metrics, **result.timing}
    store.log_metrics(run_id, [(k, v, 0) for k, v in numbers.items() if isinstance(v, (int, float))])
    store.log_metrics(run_id, loss)
    store.log_metric_series(run_id, system)
    said = {STATUS_TAG: result.status, **({ERROR_TAG: result.error} if result.error else {}), **(tags or {})}
    store.set_tags(run_id, said)
    # config.yaml holds the real values of secrets: MLflow gets the job's redacted copy or none.
    store.log_artifacts(run_id, [Path(result.run_dir) / a for a in ARTIFACTS if a != CONFIG])
    store.finish(run_id, result.status)


# A sweep's run.


@dataclass(frozen=True)
class SweepStart:
    """A sweep's run as it starts, or starts again where the store lost it."""

    sweep_dir: Path
    command: str  # the sweep's command line, its secrets redacted
    process: Mapping[str, str]  # the tags that name the sweep's process (launch.stale_runs.process_tags)


def start_sweep_run(store: MlflowStore, sweep: SweepStart) -> str:
    """A RUNNING run of a sweep; its id."""
    return store.start_run(
        "sweep " + "/".join(sweep.sweep_dir.parts[-2:]),
        ROLE_SWEEP,
        tags={SWEEP_DIR_TAG: str(sweep.sweep_dir.resolve()), "ghsweep.command": sweep.command, **sweep.process},
    )


def log_sweep_overrides(store: MlflowStore, run_id: str, overrides: Sequence[str]) -> None:
    """The sweep's overrides as Hydra parsed them, as one param."""
    store.log_params(run_id, {"sweep.overrides": " ".join(redact.overrides(overrides))})


def move_children(store: MlflowStore, lost_run_id: str, run_id: str) -> None:
    """The runs recorded under a sweep's run that the store lost, under the run that replaces it."""
    for child in store.search(parent_run_id=lost_run_id):
        store.set_tags(child.run_id, {PARENT_TAG: run_id})


def reopen_sweep_run(store: MlflowStore, run_id: str, process: Mapping[str, str]) -> bool:
    """A sweep's run RUNNING again under the process that resumes it (`process`: its tags); False
    where the store lost it."""
    try:
        store.reopen(run_id)
    except TrackingError:
        return False
    store.set_tags(run_id, process)
    return True


@dataclass(frozen=True)
class SweepTotals:
    """How many runs a sweep's jobs ended, how many of them failed, and its summary file."""

    runs: int
    failed: int
    summary: Path


def record_sweep_totals(store: MlflowStore, run_id: str, totals: SweepTotals) -> None:
    store.set_tags(run_id, {"ghsweep.runs": totals.runs, "ghsweep.failed_runs": totals.failed})
    store.log_artifacts(run_id, [totals.summary])


def finish_sweep_run(store: MlflowStore, run_id: str, status: RunStatus, error: str | None = None) -> None:
    """A sweep's run ended, with why where it was stopped or its process died (`error`)."""
    if error is not None:
        store.set_tags(run_id, {ERROR_TAG: error})
    store.finish(run_id, status)


# A tuning study, on its sweep's run and its trials' runs.


@dataclass(frozen=True)
class StudyStart:
    name: str
    storage: str  # where the study is kept
    settings: Mapping[str, Any]  # tune.* as the config sets them


def record_study_start(store: MlflowStore, run_id: str, study: StudyStart) -> None:
    store.set_tags(run_id, {STUDY_TAG: study.name, "ghsweep.tune.storage": study.storage})
    store.log_params(run_id, {f"tune.{k}": v for k, v in study.settings.items()})


def record_trial(store: MlflowStore, run_id: str, study: str, trial: int) -> None:
    """A run that measured trial `trial` of the study named `study`."""
    store.set_tags(run_id, {STUDY_TAG: study, TRIAL_TAG: trial})


@dataclass(frozen=True)
class StudyAnswer:
    report: Sequence[Path]  # the study's report files
    best_trials: Sequence[int]  # none where no trial measured anything
    best_command: str  # the command that runs the best trial's combination


def record_study_answer(store: MlflowStore, run_id: str, answer: StudyAnswer) -> None:
    store.log_artifacts(run_id, answer.report, TUNE_DIR)
    if answer.best_trials:
        store.set_tags(
            run_id,
            {
                "ghsweep.tune.best_trials": ",".join(str(n) for n in answer.best_trials),
                "ghsweep.tune.best_command": answer.best_command,
            },
        )


# A sweep's comparison report, on its run.


def record_compared_runs(store: MlflowStore, run_id: str, compared: Sequence[str]) -> None:
    """The ids of the runs a sweep's comparison reads, in job order. Past MLflow's tag size (about 240
    runs) none are listed, and the comparison reads the sweep run's children."""
    listed = ",".join(compared)
    if len(listed) <= MAX_TAG_CHARS:
        store.set_tags(run_id, {RUN_IDS_TAG: listed})


def record_report_error(store: MlflowStore, run_id: str, error: str) -> None:
    """Why a sweep has no comparison report."""
    store.set_tags(run_id, {"ghsweep.report_error": error})


@dataclass(frozen=True)
class ComparisonReport:
    out_dir: Path  # where it was written
    files: Sequence[Path]  # under out_dir
    baseline: str | None  # the label of the run it compares against
    note: str  # its verdict, shown first on the sweep run's page


def record_comparison(store: MlflowStore, run_id: str, report: ComparisonReport) -> None:
    for path in report.files:
        folder = PurePosixPath(COMPARISON_DIR, *path.parent.relative_to(report.out_dir).parts)
        store.log_artifacts(run_id, [path], str(folder))
    if report.baseline is not None:
        store.set_tags(run_id, {"ghsweep.baseline": report.baseline})
    store.set_tags(run_id, {NOTE_TAG: report.note})
