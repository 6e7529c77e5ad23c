"""The `tune.*` keys of a tuning study, checked: what to optimise, under which constraints, how long."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from ghsweep.core.errors import TuneConfigError

Direction = Literal["maximize", "minimize"]
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")
SAMPLERS = ("tpe", "random")


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: Direction


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str  # "<=" or ">="
    bound: float

    @property
    def label(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"

    def violation(self, metrics: dict[str, float]) -> float:
        """How far the run is outside the bound (0 when it holds); 1 when it did not record the metric."""
        if self.metric not in metrics:
            return 1.0
        value = metrics[self.metric]
        return max(0.0, value - self.bound if self.op == "<=" else self.bound - value)


@dataclass(frozen=True)
class TuneSettings:
    trials: int
    parallel: int
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    sampler: str
    startup_trials: int
    seed: int
    storage: str
    study: str | None
    prune: bool = False

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @classmethod
    def from_config(cls, tune: DictConfig) -> TuneSettings:
        objectives = _objectives(tune.objective, tune.direction)
        constraints = [
            Constraint(metric, op, _number(f"tune.{key}.{metric}", bound))
            for key, op in (("max", "<="), ("min", ">="))
            for metric, bound in (tune[key] or {}).items()
        ]
        if tune.max_peak_mem_gb is not None:
            constraints.append(Constraint("peak_mem_gb", "<=", _number("tune.max_peak_mem_gb", tune.max_peak_mem_gb)))
        if tune.sampler not in SAMPLERS:
            raise TuneConfigError(f"tune.sampler={tune.sampler}: unknown; accepted: {', '.join(SAMPLERS)}")
        prune = tune.get("prune", False)
        if not isinstance(prune, bool):
            raise TuneConfigError(f"tune.prune={prune}: accepted: true, false")
        if tune.get("prune_below_tokens_per_s") is not None:
            raise TuneConfigError(
                f"tune.prune_below_tokens_per_s={tune.prune_below_tokens_per_s}: set by the study for each "
                "trial (tune.prune=true), not on the command line; accepted: null"
            )
        if prune and [(o.metric, o.direction) for o in objectives] != [("tokens_per_s", "maximize")]:
            raise TuneConfigError(
                f"tune.prune=true prunes on the throughput a run measures as it trains; tune.objective="
                f"{','.join(o.metric for o in objectives)} (direction {','.join(o.direction for o in objectives)}) "
                "cannot be pruned: accepted with tune.objective=tokens_per_s tune.direction=maximize"
            )
        return cls(
            trials=_count("tune.trials", tune.trials, 1),
            parallel=_count("tune.parallel", tune.parallel, 1),
            objectives=tuple(objectives),
            constraints=tuple(constraints),
            sampler=tune.sampler,
            startup_trials=_count("tune.startup_trials", tune.startup_trials, 0),
            seed=_count("tune.seed", tune.seed, 0),
            storage=str(tune.storage),
            study=None if tune.study is None else str(tune.study),
            prune=prune,
        )


def _count(key: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TuneConfigError(f"{key}={value}: must be a whole number >= {least}")
    return value


def _number(key: str, value: object) -> float:
    # A NaN bound would hold for every run: the constraint silently off.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TuneConfigError(f"{key}={value}: must be a finite number")
    return float(value)


def _as_list(value: object) -> list[Any]:
    return cast(list[Any], OmegaConf.to_container(value)) if isinstance(value, ListConfig) else [value]


def _objectives(metric: object, direction: object) -> list[Objective]:
    metrics, directions = _as_list(metric), _as_list(direction)
    if not 1 <= len(metrics) <= 2 or not all(isinstance(m, str) and m for m in metrics):
        raise TuneConfigError(
            f"tune.objective={metric}: one metric name (e.g. tokens_per_s) or two for a Pareto "
            "front (e.g. [tokens_per_s,peak_mem_gb])"
        )
    if len(directions) != len(metrics):
        raise TuneConfigError(
            f"tune.direction={direction}: one direction per objective ({len(metrics)}), "
            f"e.g. tune.direction=[maximize,minimize]"
        )
    for d in directions:
        if d not in DIRECTIONS:
            raise TuneConfigError(f"tune.direction={d}: accepted: {', '.join(DIRECTIONS)}")
    return [Objective(m, d) for m, d in zip(metrics, directions)]
