"""The answer of a tuning study: the best combination (or the Pareto front), how much each knob
mattered (Optuna's importances), the history plot, and the command line that reproduces it."""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import FrozenTrial, TrialState  # noqa: E402
from optuna.visualization import matplotlib as optuna_plots  # noqa: E402

from ghsweep.core import stats  # noqa: E402
from ghsweep.core.run_dir import TUNE_ANSWER, TUNE_REPORT  # noqa: E402
from ghsweep.report.sweep_table import align  # noqa: E402
from ghsweep.tracking import redact  # noqa: E402
from ghsweep.tune.settings import TuneSettings  # noqa: E402
from ghsweep.tune.space import SearchSpace  # noqa: E402
from ghsweep.tune.study import PRUNED_ATTR  # noqa: E402


def command(trial: FrozenTrial) -> str:
    """The single run that reproduces a trial: its overrides, without -m (a secret's value as ***: the
    study's records hold none)."""
    return shlex.join(["python", "-m", "ghsweep", *redact.overrides(trial.user_attrs["overrides"])])


def answer(study: optuna.Study) -> list[FrozenTrial]:
    """The best feasible trial, or every trial of the Pareto front; [] when none finished within the constraints."""
    if len(study.directions) > 1:
        return sorted(study.best_trials, key=lambda t: t.number)
    try:
        return [study.best_trial]
    except ValueError:  # no COMPLETE trial, or none feasible
        return []


def objective_interval(trial: FrozenTrial, metric: str, value: float) -> stats.Interval:
    """The trial's objective with the 95% interval its run recorded (unknown bounds where none)."""
    low, high = trial.user_attrs.get(f"{metric}_ci", (float("nan"), float("nan")))
    return stats.Interval(value, low, high)


def tied_with_best(study: optuna.Study, settings: TuneSettings) -> list[FrozenTrial]:
    """One objective: the other feasible trials whose objective is not measurably different from the best's."""
    best = answer(study)
    if settings.multi_objective or not best:
        return []
    metric = settings.objectives[0].metric
    top = objective_interval(best[0], metric, best[0].values[0])
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.number != best[0].number
        and _feasible(t)
        and stats.ratio(objective_interval(t, metric, t.values[0]), top).contains(1.0)
    ]


def _feasible(trial: FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def trial_table(study: optuna.Study, settings: TuneSettings, space: SearchSpace) -> str:
    best = {t.number for t in answer(study)}
    tied = {t.number for t in tied_with_best(study, settings)}
    header = ["trial", *space.distributions, *(o.metric for o in settings.objectives), "state", "best", "note"]
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        pruned = t.user_attrs.get(PRUNED_ATTR)
        if t.state == TrialState.COMPLETE:
            values = [format(v, ".4g") for v in t.values]
        elif pruned and t.intermediate_values:  # what it measured before it was stopped
            values = [format(t.intermediate_values[max(t.intermediate_values)], ".4g")]
        else:
            values = ["-"] * len(settings.objectives)
        state = (
            "finished"
            if t.state == TrialState.COMPLETE and _feasible(t)
            else "infeasible"
            if t.state == TrialState.COMPLETE
            else "pruned"
            if pruned
            else "failed"
        )
        broken = ", ".join(k for k, v in t.constraints.items() if v > 0)
        note = t.user_attrs.get("error") or pruned or (f"violates {broken}" if broken else "")
        rows.append(
            [
                str(t.number),
                *(str(t.params.get(k, "-")) for k in space.distributions),
                *values,
                state,
                "*" if t.number in best else "= (tied)" if t.number in tied else "",
                note,
            ]
        )
    return align(header, rows)


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's warnings that say nothing to a user here: its matplotlib plots are marked experimental,
    and its importance evaluator says it favours low targets whenever it is given one (_target is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
        # Too few finished trials: the summary says so itself ("needs more finished trials").
        warnings.filterwarnings("ignore", message="The number of trials is too small to compute importances")
        yield


def _target(settings: TuneSettings, i: int):
    """Objective i as a value to minimise: Optuna's importance evaluator ranks what achieves low targets."""
    sign = -1.0 if settings.objectives[i].direction == "maximize" else 1.0
    return lambda trial: sign * trial.values[i]


def importances(study: optuna.Study, settings: TuneSettings) -> dict[str, dict[str, float]]:
    """Per objective, each knob's share of the objective's variation over the finished trials."""
    found = {}
    for i, objective in enumerate(settings.objectives):
        with quiet_optuna():
            try:
                found[objective.metric] = optuna.importance.get_param_importances(study, target=_target(settings, i))
            except (ValueError, RuntimeError, ZeroDivisionError):  # too few finished trials, or no knob varied
                found[objective.metric] = {}
    return found


def _save(axes, path: Path) -> Path:
    figure = (axes[0] if hasattr(axes, "__len__") else axes).get_figure()
    figure.set_size_inches(8, 5)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _objective_value(i: int) -> Callable[[FrozenTrial], float]:
    """A trial's value of objective i, the target of a plot of one objective."""
    return lambda t: t.values[i]


def plots(study: optuna.Study, settings: TuneSettings, out_dir: Path) -> list[Path]:
    """History of each objective, knob importances, and the Pareto front of two objectives."""
    files: list[Path] = []
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return files
    for i, objective in enumerate(settings.objectives):
        files.append(
            _save(
                optuna_plots.plot_optimization_history(study, target=_objective_value(i), target_name=objective.metric),
                out_dir / f"history_{objective.metric}.png",
            )
        )
    for metric, shares in importances(study, settings).items():
        if shares:
            i = [o.metric for o in settings.objectives].index(metric)
            files.append(
                _save(
                    optuna_plots.plot_param_importances(study, target=_target(settings, i), target_name=metric),
                    out_dir / f"importance_{metric}.png",
                )
            )
    if settings.multi_objective:
        files.append(
            _save(
                optuna_plots.plot_pareto_front(study, target_names=[o.metric for o in settings.objectives]),
                out_dir / "pareto_front.png",
            )
        )
    return files


def summarize(study: optuna.Study, settings: TuneSettings, space: SearchSpace) -> str:
    """The study's answer in words, for the terminal and the report."""
    states = [t.state for t in study.trials]
    pruned = sum(1 for t in study.trials if t.state == TrialState.PRUNED and PRUNED_ATTR in t.user_attrs)
    lines = [
        f"ghsweep tune: study {study.study_name}: {states.count(TrialState.COMPLETE)} trials finished, "
        + (f"{pruned} pruned (slower than the best beyond the noise), " if pruned else "")
        + f"{states.count(TrialState.PRUNED) - pruned} failed"
        + (
            f"; {states.count(TrialState.FAIL)} not counted (a repeat of a measured combination, "
            "an infrastructure failure or an interrupted trial, each asked again)"
            if TrialState.FAIL in states
            else ""
        ),
        "objective: "
        + ", ".join(f"{o.direction} {o.metric}" for o in settings.objectives)
        + ("; constraints: " + ", ".join(c.label for c in settings.constraints) if settings.constraints else ""),
        "",
        trial_table(study, settings, space),
        "",
    ]
    best = answer(study)
    if not best:
        lines.append(
            "No trial finished within the constraints: no answer (see the failed and infeasible trials above)."
        )
    for t in best:
        values = ", ".join(f"{o.metric}={v:.4g}" for o, v in zip(settings.objectives, t.values))
        lead = "Pareto front" if settings.multi_objective else "Best"
        lines += [
            f"{lead}: trial {t.number}: {values}: " + " ".join(f"{k}={t.params[k]}" for k in space.distributions),
            f"  reproduce: {command(t)}",
        ]
    tied = tied_with_best(study, settings)
    if tied:
        lines.append(
            "Tied with the best within the noise of their runs (95% intervals overlap 1.0 in ratio): "
            + ", ".join(f"trial {t.number}" for t in tied)
        )
    for metric, shares in importances(study, settings).items():
        text = (
            ", ".join(f"{k} {v:.2f}" for k, v in shares.items())
            if shares
            else "needs more finished trials with different knob values"
        )
        lines.append(f"Knob importance for {metric} (Optuna): {text}")
    return "\n".join(lines)


def write_report(study: optuna.Study, settings: TuneSettings, space: SearchSpace, out_dir: Path) -> list[Path]:
    """tune.md, best.txt (the reproducing command lines) and the plots, in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_optuna():
        images = plots(study, settings, out_dir)
    text = redact.text(summarize(study, settings, space))
    (out_dir / TUNE_ANSWER).write_text("".join(command(t) + "\n" for t in answer(study)))
    markdown = f"# Tuning study {study.study_name}\n\n```\n{text}\n```\n\n" + "".join(
        f"![{p.stem}]({p.name})\n\n" for p in images
    )
    (out_dir / TUNE_REPORT).write_text(redact.text(markdown))
    return [out_dir / TUNE_REPORT, out_dir / TUNE_ANSWER, *images]
