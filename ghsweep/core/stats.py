"""Step-time statistics: which steps are steady, their median, and a 95% confidence interval.

One module for the worker, the bench, the comparison, the gate and the tune report, so a number and
its interval mean the same everywhere.

- Warm-up end: MSER (the marginal standard error rule of White, 1997), searched from the configured
  minimum to half the series: the cut that minimises the steady part's variance over its length
  squared. Compile, autotune and allocator warm-up make the first steps slower by amounts that vary
  with the combination, so the cut comes from the series itself. Steps more than 10 robust standard
  deviations above the second half's median are clipped for the search only, so one late outlier
  cannot pull the cut past it.
- Interval: a moving-block bootstrap of the median (Kunsch, 1989). Step times are autocorrelated
  (the same documents repeat with the data order, the allocator and clocks drift), so steps are
  resampled in blocks of about n^(1/3) consecutive steps, which keeps their short-range dependence;
  the interval is the 2.5th to 97.5th percentile of the resampled medians. The resampling is seeded:
  the same series gives the same interval.
- Ratios (speedups, a sweep against a reference): two independent intervals combine on the log
  scale, the half-widths in quadrature.
- Repeats (separate processes): the mean of their medians with a Student t interval over them,
  never narrower than the widest within-run interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
# Fewer steady steps than this: no interval (a median of 3 steps says nothing about its spread).
MIN_STEADY = 4
# Clip at this many robust SDs (1.4826 x MAD) above the median for the warm-up search.
CLIP_SDS = 10.0
# Student t quantiles (97.5%) for 1..10 degrees of freedom; more: the normal's.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class Interval:
    """An estimate and its 95% confidence interval (low, high); nan bounds: too few samples."""

    estimate: float
    low: float
    high: float

    @property
    def known(self) -> bool:
        return all(math.isfinite(v) for v in (self.estimate, self.low, self.high))

    @property
    def half_width_pct(self) -> float:
        """Half the interval's width in percent of the estimate (nan where unknown)."""
        if not self.known or self.estimate == 0:
            return float("nan")
        return (self.high - self.low) / 2 / abs(self.estimate) * 100

    def contains(self, value: float) -> bool:
        return self.known and self.low <= value <= self.high

    def inverse(self, scale: float = 1.0) -> Interval:
        """scale / x: the interval of a rate from that of a time (the median maps through exactly)."""
        return Interval(scale / self.estimate, scale / self.high, scale / self.low)


def unknown(estimate: float) -> Interval:
    return Interval(estimate, float("nan"), float("nan"))


def warmup_end(times: Sequence[float], minimum: int = 0) -> int:
    """Index of the first steady step: MSER's cut, at least `minimum`, at most half the series."""
    n = len(times)
    if n - minimum < 2 * MIN_STEADY:
        return min(minimum, n)
    x = np.asarray(times, dtype=float)
    tail = x[n // 2 :]
    med = float(np.median(tail))
    mad = float(np.median(np.abs(tail - med))) * 1.4826
    x = np.minimum(x, med + CLIP_SDS * mad) if mad > 0 else x
    best, best_score = minimum, math.inf
    for d in range(minimum, n // 2 + 1):
        rest = x[d:]
        score = float(np.var(rest)) / len(rest)
        if score < best_score:
            best, best_score = d, score
    return best


def block_length(n: int) -> int:
    return max(1, round(n ** (1 / 3)))


def median_interval(values: Sequence[float]) -> Interval:
    """The median of `values` (in order: consecutive steps) and its moving-block bootstrap interval."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return unknown(float("nan"))
    estimate = float(np.median(x))
    if len(x) < MIN_STEADY:
        return unknown(estimate)
    n, length = len(x), block_length(len(x))
    rng = np.random.default_rng(SEED)
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n - length + 1, size=(RESAMPLES, blocks))
    idx = (starts[:, :, None] + np.arange(length)).reshape(RESAMPLES, -1)[:, :n]
    medians = np.median(x[idx], axis=1)
    alpha = (1 - CONFIDENCE) / 2
    low, high = np.quantile(medians, [alpha, 1 - alpha])
    return Interval(estimate, min(float(low), estimate), max(float(high), estimate))


# The metrics StepStats.metrics writes (the interval's only where there are enough steady steps).
STEP_METRICS = (
    "step_time_ms",
    "tokens_per_s",
    "steady_steps",
    "warmup_steps_detected",
    "excluded_steps",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
    "step_time_ms_ci_pct",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "tokens_per_s_ci_pct",
)


@dataclass(frozen=True)
class StepStats:
    """The steady part of a run's step-time series and what it measured."""

    warmup_steps: int  # steps the warm-up took (detected, at least the configured minimum)
    steady_steps: int
    excluded_steps: int  # steps left out whatever their time (the profiler's capture window)
    step_time_ms: Interval

    def metrics(self, tokens_per_step: float) -> dict[str, float]:
        """The metric names every backend records (docs/measurements.md: Metrics)."""
        step, rate = self.step_time_ms, self.step_time_ms.inverse(tokens_per_step * 1000.0)
        out = {
            "step_time_ms": step.estimate,
            "tokens_per_s": rate.estimate,
            "steady_steps": float(self.steady_steps),
            "warmup_steps_detected": float(self.warmup_steps),
            "excluded_steps": float(self.excluded_steps),
        }
        if step.known:
            out |= {
                "step_time_ms_ci_low": step.low,
                "step_time_ms_ci_high": step.high,
                "step_time_ms_ci_pct": step.half_width_pct,
                "tokens_per_s_ci_low": rate.low,
                "tokens_per_s_ci_high": rate.high,
                "tokens_per_s_ci_pct": rate.half_width_pct,
            }
        return out


def step_stats(times: Sequence[float], min_warmup: int, excluded: Iterable[int] = ()) -> StepStats:
    """The steady steps of `times` (step i at index i): without `excluded` (e.g. the profiler's
    capture steps, whatever the profiler costs them), after the warm-up detected in the rest."""
    skip = {i for i in excluded if 0 <= i < len(times)}
    kept = [t for i, t in enumerate(times) if i not in skip]
    start = warmup_end(kept, min_warmup)
    steady = kept[start:]
    # A run too short for its warm-up (train.warmup_steps >= the steps it kept) still reports a step
    # time, over every kept step, with steady_steps 0 saying it is no steady-state number.
    return StepStats(min(start, len(kept)), len(steady), len(skip), median_interval(steady or kept or list(times)))


def ratio(a: Interval, b: Interval) -> Interval:
    """a / b with an interval from both (independent): log half-widths added in quadrature."""
    value = a.estimate / b.estimate
    if not (a.known and b.known):
        return unknown(value)
    spread = math.hypot(_log_half_width(a), _log_half_width(b))
    return Interval(value, value * math.exp(-spread), value * math.exp(spread))


def _log_half_width(i: Interval) -> float:
    return max(math.log(i.high / i.estimate), math.log(i.estimate / i.low))


def from_metrics(metrics: dict, name: str) -> Interval | None:
    """A recorded metric and its interval (`NAME_ci_low`, `NAME_ci_high`); None if not recorded."""
    if metrics.get(name) is None:
        return None
    low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
    if low is None or high is None:
        return unknown(float(metrics[name]))
    return Interval(float(metrics[name]), float(low), float(high))


def combine_repeats(estimates: Sequence[float], within: Sequence[Interval]) -> Interval:
    """N repeats of one combination: the mean of their estimates, a t interval over them (between-
    repeat spread), widened to the widest within-run interval's relative half-width."""
    x = np.asarray(estimates, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return within[0] if within else unknown(mean)
    t = T_975[len(x) - 2] if len(x) - 1 <= len(T_975) else 1.96
    half = t * float(x.std(ddof=1)) / math.sqrt(len(x))
    widest = max((i.half_width_pct for i in within if i.known), default=0.0) / 100 * mean
    half = max(half, widest)
    return Interval(mean, mean - half, mean + half)


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / mean in percent: how far apart the repeats are."""
    x = np.asarray(values, dtype=float)
    return float((x.max() - x.min()) / x.mean() * 100) if len(x) else float("nan")
