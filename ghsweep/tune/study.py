"""The Optuna study behind a tuning sweep: opened from its storage, told each trial's run.

The study lives in an Optuna storage beside the sweeps (`tune.storage`, a journal file in the launch
directory by default) under a name fixed by what is searched: rerunning the same command loads it
and goes on to `tune.trials` trials. A trial left running by a stopped sweep is marked FAIL and its
knob values are asked again first; if its run had finished in MLflow, the launcher reuses it.

A run that failed for its combination (a deterministic failure: bad combination, out of memory,
crash) is told as a PRUNED trial that violates the constraint `run_failed`: Optuna's samplers learn
from COMPLETE and PRUNED trials only, and rank infeasible ones below every feasible one, so the
sampler steers away from it. The same knob values asked again fail the same way without running
(force=true runs them again). A run that failed for its infrastructure (its node, the network, the
GPU's hardware; after the launcher's own retries) says nothing about its combination: the trial is
told FAIL, which samplers ignore and which does not count towards `tune.trials`, and its knob
values are asked again once.

With tune.prune, each batch's runs are given the best feasible trial's lower tokens/s bound
(prune_bar); a run that measured itself slower beyond the noise stops early and is told as a
PRUNED trial with its tokens/s as the last intermediate value (the `pruned` user attribute says
why): what it measured is kept, and it is not a failure.

In a finite space (categorical and integer knobs) a trial is never spent on a combination the study
has already measured while others remain: a sampler's repeat is told FAIL (`repeat_of`) and an
unmeasured combination, drawn with the study's seed, is asked in its place.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from hydra.core.utils import JobReturn
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import Trial, TrialState

from ghsweep.core.errors import one_line
from ghsweep.core.failures import DETERMINISTIC, INFRASTRUCTURE, failure_class
from ghsweep.core.names import MEASURE_PRUNED
from ghsweep.core.run_dir import SUMMARY
from ghsweep.core.run_result import RunStatus
from ghsweep.core.run_summary import RunSummary
from ghsweep.tune.settings import TuneSettings
from ghsweep.tune.space import SearchSpace

RUN_FAILED = "run_failed"
# The user attribute of a trial stopped early for being slower than the best (tune.prune): why.
PRUNED_ATTR = "pruned"
# Spaces of more combinations than this are not enumerated to avoid repeats (a repeat there is rare).
MAX_ENUMERATED = 100_000

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class TrialOutcome:
    """What a trial's run ended with, from the job's return value (a RunResult as a dict)."""

    overrides: list[str]
    status: RunStatus
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    run_id: str | None = None
    run_dir: str | None = None
    failure_class: str | None = None
    measure_stop: str | None = None  # why its run stopped measuring (summary.json's info)

    @classmethod
    def from_job(cls, job: JobReturn, overrides: list[str]) -> TrialOutcome:
        try:
            result = job.return_value
        except Exception as exc:  # the task itself raised: Hydra keeps the exception in the JobReturn
            return cls(overrides, RunStatus.FAILED, error=one_line(exc))
        if not result:
            return cls(overrides, RunStatus.FAILED, error="the job returned no result")
        run_dir = result.get("run_dir")
        return cls(
            overrides,
            RunStatus(result["status"]),
            dict(result.get("metrics") or {}),
            result.get("error"),
            result.get("mlflow_run_id"),
            run_dir,
            result.get("failure_class"),
            _measure_stop(Path(run_dir)) if run_dir else None,
        )


def _measure_stop(run_dir: Path) -> str | None:
    """Why the run in `run_dir` stopped measuring (its summary.json's info), None where it wrote none."""
    if not (run_dir / SUMMARY).exists():
        return None
    stop = RunSummary.load(run_dir).info.get("measure_stop")
    return None if stop is None else str(stop)


def study_name(settings: TuneSettings, space: SearchSpace) -> str:
    """The default name: the same search, objective and constraints give the same study."""
    spec = {
        "space": space.fingerprint(),
        "objectives": [(o.metric, o.direction) for o in settings.objectives],
        "constraints": sorted(c.label for c in settings.constraints),
    }
    return "tune-" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _storage(storage: str, cwd: str) -> str | JournalStorage:
    if "://" in storage:
        return storage  # any Optuna storage URL: sqlite:///..., postgresql://...
    path = Path(cwd, storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readable by its owner only, as the run directories' config.yaml: the study's records are the user's.
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
    path.chmod(0o600)
    return JournalStorage(JournalFileBackend(str(path)))


def _sqlite_file(storage: str, cwd: str) -> Path | None:
    """The file of a `sqlite:///PATH` storage URL (relative to the launch directory), None for another."""
    if not storage.startswith("sqlite:///") or storage == "sqlite:///:memory:":
        return None
    return Path(cwd, storage.removeprefix("sqlite:///"))


def storage_damage(storage: str, cwd: str) -> str | None:
    """What is wrong with the study's existing storage (None when it is missing, empty or readable):
    a journal whose lines are not whole JSON records (random bytes, a write cut short), a sqlite file
    that is not a database. Optuna reads past a damaged last line and appends after it, so the
    study would go on from a damaged record."""
    retry = f"restore it, or start a new study in another file (tune.storage=NEW{Path(storage).suffix})"
    sqlite_file = _sqlite_file(storage, cwd)
    if sqlite_file is not None:
        if not sqlite_file.is_file() or sqlite_file.stat().st_size == 0:
            return None
        with sqlite_file.open("rb") as db:
            if db.read(16) != b"SQLite format 3\x00":
                return f"tune.storage={storage}: {sqlite_file} is not an SQLite database; {retry}"
        return None
    if "://" in storage:
        return None  # a database server: Optuna says what it finds there
    path = Path(cwd, storage)
    if not path.is_file():
        return None if not path.exists() else f"tune.storage={storage}: {path} is not a file; {retry}"
    for number, line in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            return f"tune.storage={storage}: {path} line {number} is cut short (no end of line); {retry}"
        try:
            record = json.loads(line)
        except ValueError:
            return f"tune.storage={storage}: {path} line {number} is not a JSON record of an Optuna journal; {retry}"
        if not isinstance(record, dict) or "op_code" not in record:
            return f"tune.storage={storage}: {path} line {number} is not a record of an Optuna journal; {retry}"
    return None


def _sampler(settings: TuneSettings, seed: int) -> optuna.samplers.BaseSampler:
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: trials asked together in one batch are spread out instead of asked twice.
    # Multivariate TPE (knobs modelled jointly) is marked experimental; it is what we want here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=settings.startup_trials, multivariate=True, constant_liar=settings.parallel > 1
        )


def open_study(settings: TuneSettings, space: SearchSpace, cwd: str, in_memory: bool = False) -> optuna.Study:
    study = optuna.create_study(
        storage=None if in_memory else _storage(settings.storage, cwd),
        study_name=settings.study or study_name(settings, space),
        directions=[o.direction for o in settings.objectives],
        load_if_exists=True,
    )
    sqlite_file = None if in_memory else _sqlite_file(settings.storage, cwd)
    if sqlite_file is not None:
        sqlite_file.chmod(0o600)  # as a journal file: the study's records are the user's
    for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(stale.number, state=TrialState.FAIL)
        study.enqueue_trial(stale.params, user_attrs={"retry_of": stale.number})
    # Seeded by the trials so far: a resumed study goes on with a new, still reproducible, stream.
    study.sampler = _sampler(settings, settings.seed + len(study.trials))
    return study


def trials_done(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def earlier_failures(study: optuna.Study) -> dict[tuple, str]:
    """The knob values of the study's trials that failed for their combination (deterministic), each
    with its first failure: a trial asking for them again is told that failure instead of running it
    again (an OOM costs a whole run). Infrastructure failures are not answered from record."""
    failures: dict[tuple, str] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        if PRUNED_ATTR not in t.user_attrs and t.user_attrs.get("failure_class", DETERMINISTIC) == DETERMINISTIC:
            failures.setdefault(knob_values(t.params), f"as in trial {t.number}: {t.user_attrs.get('error')}")
    return failures


def prune_bar(study: optuna.Study) -> float | None:
    """The tokens/s a trial must not fall below beyond its noise (tune.prune): the lower end of the
    best feasible finished trial's 95% interval (its value where the run recorded none); None before
    any trial finished within the constraints."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    low = float(best.user_attrs.get("tokens_per_s_ci", [best.value])[0])
    return best.value if math.isnan(low) else low


def measured(study: optuna.Study) -> set[tuple]:
    """The knob values of every trial the study has an answer for (finished or failed)."""
    return {
        knob_values(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    }


def combinations(space: SearchSpace) -> list[tuple] | None:
    """Every combination of a finite space as knob_values tuples; None for a space with a float knob
    or of more than MAX_ENUMERATED combinations."""
    values: dict[str, list] = {}
    size = 1
    for name, dist in space.distributions.items():
        if isinstance(dist, CategoricalDistribution):
            values[name] = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            values[name] = list(range(dist.low, dist.high + 1, dist.step))
        else:
            return None
        size *= len(values[name])
    if size > MAX_ENUMERATED:
        return None
    names = list(values)
    return [knob_values(dict(zip(names, combo))) for combo in itertools.product(*values.values())]


def ask_unmeasured(study: optuna.Study, space: SearchSpace, taken: set[tuple], seed: int) -> Trial:
    """study.ask, except that a combination in `taken` (measured, or asked for this batch) is not
    asked again while the finite space has others: that trial is told FAIL and an unmeasured
    combination, drawn with `seed`, is asked instead."""
    trial = study.ask(space.distributions)
    asked = knob_values(trial.params)
    if asked not in taken:
        return trial
    remaining = [c for c in combinations(space) or [] if c not in taken]
    if not remaining:  # every combination measured (or a space too large to list): a repeat is all there is
        return trial
    trial.set_user_attr("repeat_of", "measured before")
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(dict(random.Random(seed).choice(remaining)), user_attrs={"instead_of_repeat": trial.number})
    return study.ask(space.distributions)


def knob_values(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def tell(
    study: optuna.Study, settings: TuneSettings, trial: Trial, outcome: TrialOutcome, bar: float | None = None
) -> str:
    """Tell the study how the trial's run went; returns a one-line account of it. `bar`: the tokens/s
    the trial was asked not to fall below (tune.prune)."""
    trial.set_user_attr("overrides", outcome.overrides)
    for key in ("run_id", "run_dir"):
        if getattr(outcome, key):
            trial.set_user_attr(key, getattr(outcome, key))
    missing = [o.metric for o in settings.objectives if o.metric not in outcome.metrics]
    error = outcome.error or (f"status {outcome.status}" if outcome.status != RunStatus.FINISHED else None)
    if error is None and missing:
        error = (
            f"the run recorded no {missing[0]} (tune.objective); it recorded: "
            f"{', '.join(sorted(outcome.metrics)) or 'nothing'}"
        )
    if error is not None:
        cls = outcome.failure_class or failure_class(error)
        trial.set_user_attr("error", error)
        trial.set_user_attr("failure_class", cls)
        if cls == INFRASTRUCTURE and "retry_of" not in trial.user_attrs:
            # Nothing learnt about the combination: not a trial of the study; asked again once.
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            return f"failed for its infrastructure: {error}; asked again"
        trial.set_constraint(RUN_FAILED, 1.0)
        study.tell(trial, state=TrialState.PRUNED)
        return f"failed ({cls}): {error}"
    trial.set_constraint(RUN_FAILED, 0.0)
    for o in settings.objectives:  # the objective's 95% interval, for the report's ties
        if f"{o.metric}_ci_low" in outcome.metrics and f"{o.metric}_ci_high" in outcome.metrics:
            trial.set_user_attr(
                f"{o.metric}_ci", [outcome.metrics[f"{o.metric}_ci_low"], outcome.metrics[f"{o.metric}_ci_high"]]
            )
    broken = []
    for constraint in settings.constraints:
        violation = constraint.violation(outcome.metrics)
        trial.set_constraint(constraint.label, violation)
        if violation > 0:
            broken.append(constraint.label)
    values = [outcome.metrics[o.metric] for o in settings.objectives]
    told = ", ".join(f"{o.metric}={v:.4g}" for o, v in zip(settings.objectives, values))
    if outcome.measure_stop == MEASURE_PRUNED and bar is not None:
        # Optuna's pruned trial: its last intermediate value is what the samplers learn from.
        steps = int(outcome.metrics.get("steps", 0))
        high = outcome.metrics.get("tokens_per_s_ci_high", values[0])
        why = f"stopped after {steps} steps: tokens/s at most {high:.4g} (95%), below the best's {bar:.4g}"
        trial.set_user_attr(PRUNED_ATTR, why)
        trial.report(values[0], step=steps)
        study.tell(trial, state=TrialState.PRUNED)
        return f"pruned, {told}: {why}"
    study.tell(trial, values)
    return told + (f" (infeasible: {', '.join(broken)} does not hold)" if broken else "")
