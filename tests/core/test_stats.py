"""The step-time statistics on synthetic series whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest

from ghsweep.core import stats

TRUE_MS = 234.0


def ar1(n: int, sd_pct: float, phi: float, seed: int) -> np.ndarray:
    """Autocorrelated noise around TRUE_MS: an AR(1) series with the given marginal SD (% of TRUE_MS)."""
    rng = np.random.default_rng(seed)
    sd = TRUE_MS * sd_pct / 100
    e = rng.normal(0, sd * np.sqrt(1 - phi**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return TRUE_MS + x


def test_stationary_noise_the_interval_covers_the_truth_about_95_percent_of_the_time():
    # Autocorrelated steps (phi 0.5, SD 2.2% as measured on an H100): an interval that ignored the
    # correlation would cover far less often.
    covered = [stats.median_interval(ar1(60, 2.2, 0.5, seed)).contains(TRUE_MS) for seed in range(200)]
    assert 0.88 <= np.mean(covered) <= 0.995


def test_the_interval_narrows_with_more_steps():
    short = stats.median_interval(ar1(20, 2.2, 0.3, 1)).half_width_pct
    long = stats.median_interval(ar1(320, 2.2, 0.3, 1)).half_width_pct
    assert long < short / 2.5


def test_a_long_warm_up_is_detected_from_the_series():
    warm = np.linspace(3 * TRUE_MS, TRUE_MS * 1.05, 12)  # 12 slow steps: compile, autotune, allocator
    series = np.concatenate([[40 * TRUE_MS], warm, ar1(40, 1.0, 0.3, 2)])
    s = stats.step_stats(series, min_warmup=3)
    assert 13 <= s.warmup_steps <= 20  # MSER may cut a few steady steps too, never keep warm ones
    assert s.step_time_ms.contains(TRUE_MS)


def test_the_configured_warm_up_is_the_minimum():
    s = stats.step_stats(ar1(40, 1.0, 0.0, 3), min_warmup=5)
    assert s.warmup_steps >= 5 and s.steady_steps <= 35


def test_a_drift_widens_the_interval_honestly():
    steady = ar1(60, 0.5, 0.0, 4)
    drifting = steady + np.linspace(0, 0.1 * TRUE_MS, 60)  # clocks falling 10% over the run
    assert stats.median_interval(drifting).half_width_pct > 3 * stats.median_interval(steady).half_width_pct


def test_outliers_move_neither_the_median_nor_the_warm_up_cut():
    series = ar1(60, 1.0, 0.0, 5)
    series[[25, 40, 52]] = 10 * TRUE_MS  # a checkpoint, a GC pause, another process
    s = stats.step_stats(series, min_warmup=3)
    assert s.warmup_steps <= 6
    assert s.step_time_ms.contains(TRUE_MS) and s.step_time_ms.half_width_pct < 1.5


def test_capture_steps_are_left_out_of_the_steady_steps():
    series = ar1(30, 0.5, 0.0, 6)
    series[5:8] = 1.5 * TRUE_MS  # what a profiler costs the steps it records
    s = stats.step_stats(series, min_warmup=3, excluded=range(5, 8))
    assert s.excluded_steps == 3 and s.steady_steps + s.warmup_steps == 27
    assert s.step_time_ms.contains(TRUE_MS) and s.step_time_ms.high < 1.05 * TRUE_MS


def test_too_few_steps_give_no_interval():
    s = stats.step_stats([300.0, 240.0, 235.0], min_warmup=1)
    assert s.step_time_ms.estimate == pytest.approx(237.5)
    assert not s.step_time_ms.known and "tokens_per_s_ci_low" not in s.metrics(4096)


def test_rates_invert_the_time_interval():
    s = stats.step_stats(ar1(40, 1.0, 0.0, 7), min_warmup=3)
    m = s.metrics(4096)
    assert m["tokens_per_s_ci_low"] == pytest.approx(4096 / (m["step_time_ms_ci_high"] / 1000))
    assert m["tokens_per_s_ci_low"] < m["tokens_per_s"] < m["tokens_per_s_ci_high"]


def test_ratio_of_the_same_truth_includes_one_and_a_real_difference_excludes_it():
    a = stats.median_interval(ar1(60, 2.0, 0.3, 8))
    same = stats.median_interval(ar1(60, 2.0, 0.3, 9))
    faster = stats.median_interval(ar1(60, 2.0, 0.3, 10) * 0.9)
    assert stats.ratio(a, same).contains(1.0)
    r = stats.ratio(a, faster)
    assert not r.contains(1.0) and r.contains(1 / 0.9)


def test_repeats_combine_between_and_within_spread():
    within = [stats.Interval(100.0, 99.5, 100.5)] * 3
    tight = stats.combine_repeats([100.0, 100.1, 99.9], within)
    assert tight.half_width_pct == pytest.approx(0.5)  # the within-run width dominates
    apart = stats.combine_repeats([100.0, 104.0, 96.0], within)
    assert apart.half_width_pct > 5  # t(2) x SD 4 / sqrt(3)
    assert stats.spread_pct([96.0, 104.0]) == pytest.approx(8.0)


def test_a_run_shorter_than_its_warm_up_says_it_has_no_steady_step():
    s = stats.step_stats([900.0, 120.0], min_warmup=3)
    assert s.steady_steps == 0 and s.warmup_steps == 2
    # Still a number, over every step, marked as no steady state by steady_steps 0 (the run report says so).
    assert s.step_time_ms.estimate == 510.0 and not s.step_time_ms.known
