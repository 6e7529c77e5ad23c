"""A short markdown report of one run, kept in its run directory and attached in MLflow."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ghsweep.core import stats
from ghsweep.core.atomic import write_atomic
from ghsweep.core.run_dir import REPORT
from ghsweep.core.run_result import SETUP_PARTS, TRAIN_PARTS, WORKER_PARTS, RunResult

METRIC_UNITS = {
    "step_time_ms": "ms (median of steady-state steps)",
    "tokens_per_s": "tokens/s",
    "peak_mem_gb": "GiB",
    "final_loss": "",
}


def with_interval(metrics: dict, key: str) -> str:
    """`value [low, high]` where the run recorded the metric's interval."""
    i = stats.from_metrics(metrics, key)
    if i is None:
        return "-"
    return f"{i.estimate:.4g} [{i.low:.4g}, {i.high:.4g}]" if i.known else f"{i.estimate:.4g}"


def write_run_report(result: RunResult, asked: Mapping[str, Any], info: dict, path: Path) -> None:
    """report.md of `result`. `asked` is the composed config resolved into plain containers, a record of
    what was asked like the run's config.yaml: a run validation refused gets its report too, and no
    typed config exists of it."""
    lines = [f"# ghsweep run `{result.name}`", "", f"Status: **{result.status}**", ""]
    if result.error:
        lines += [f"Error: `{result.error}`", ""]
    offload = asked["offload"]
    lines += [
        "| knob | value |",
        "|---|---|",
        f"| model | {asked['model']['name']} |",
        f"| peft | {asked['peft']['name']} |",
        f"| precision | {asked['precision']['name']} |",
        f"| offload | {'on, ' + str(offload['num_layers']) + ' layers' if offload['enabled'] else 'off'} |",
        f"| memory | {asked['memory']['name']} |",
        f"| dataloader.num_workers | {asked['dataloader']['num_workers']} |",
        # What stepped the weights (train.optimizer=auto resolved), where the backend says.
        *([f"| optimizer | {info['optimizer']} |"] if "optimizer" in info else []),
        f"| device | {info.get('device_name', asked['device'])} |",
        "",
    ]
    if result.metrics:
        lines += ["| metric | value | unit |", "|---|---|---|"]
        for key, unit in METRIC_UNITS.items():
            if key in result.metrics:
                lines.append(f"| {key} | {with_interval(result.metrics, key)} | {unit} |")
        if result.metrics.get("steady_steps") == 0:
            lines += [
                "",
                f"No steady step: the warm-up (at least train.warmup_steps={asked['train']['warmup_steps']}) took all "
                f"{result.metrics.get('steps', 0):.0f} steps, so step_time_ms and tokens_per_s include warm-up; "
                "a longer run (train.max_steps) measures the steady state.",
            ]
        elif "steady_steps" in result.metrics:
            m = result.metrics
            lines += [
                "",
                f"Steady steps: {m['steady_steps']:.0f} (after {m.get('warmup_steps_detected', 0):.0f} warm-up "
                f"steps, {m.get('excluded_steps', 0):.0f} profiled steps left out); intervals: 95% confidence "
                "of the median, a moving-block bootstrap over the steady steps"
                + (f"; measuring ended by {info['measure_stop']}." if "measure_stop" in info else "."),
            ]
            lines += gc_lines(m, asked["train"])
        first, last = result.metrics.get("first_loss"), result.metrics.get("final_loss")
        if first is not None and last is not None:
            lines += [
                "",
                f"Loss went from {first:.4f} (first step) to {last:.4f} (last step) "
                f"over {result.metrics.get('steps', 0):.0f} steps.",
            ]
        lines.append("")
    if result.timing:
        t = result.timing
        # The parts of setup_s and train_s are shown inside them, so the parts of the whole still add up.
        within = {"setup_s": SETUP_PARTS, "train_s": TRAIN_PARTS}

        def shown(key: str, seconds: float) -> str:
            inner = [f"{k.removesuffix('_s')} {t[k]:.2f} s" for k in within.get(key, ()) if k in t]
            return f"{key.removesuffix('_s')} {seconds:.2f} s" + (f" ({', '.join(inner)})" if inner else "")

        parts = [shown(k, v) for k, v in t.items() if k not in ("wall_s", "overhead_s", *WORKER_PARTS)]
        lines.append(f"Time: {t.get('wall_s', 0):.2f} s in all ({', '.join(parts)}).")
        if "overhead_s" in t:
            lines.append(f"Outside the training loop: {t['overhead_s']:.2f} s.")
    write_atomic(path, "\n".join(lines) + "\n", mode=0o644)


def gc_lines(metrics: dict, train: Mapping[str, Any]) -> list[str]:
    """What Python's garbage collector did to the steps after the warm-up, where a pause of it could
    move a step by more than the interval the run measures to (train.measure_ci_pct of its median
    step); nothing otherwise."""
    longest, step_ms = metrics.get("gc_pause_max_ms"), metrics.get("step_time_ms")
    if longest is None or not step_ms or longest < step_ms * train["measure_ci_pct"] / 100:
        return []
    interval = train.get("gc_interval")
    said = (
        f"Python's garbage collector after the warm-up: {metrics['gc_pause_ms_per_step']:.2f} ms a step on average, "
        f"the longest pause {longest:.1f} ms ({100 * longest / step_ms:.1f}% of the median step), "
        f"{metrics['gc_full_collections']:.0f} full collections"
    )
    if interval is None:
        # A host stopped for a collection is a step-time spike the interval then has to average out.
        return [f"{said}: train.gc_interval=50 collects at fixed steps instead (compare: train.gc_interval=null,50)."]
    return [f"{said}, with train.gc_interval={interval}: its collections cost this; a larger interval, fewer of them."]


def summary_line(result: RunResult, tracking_uri: str, experiment: str) -> str:
    """The last line of a single run: how it ended, its throughput, and where its records are."""
    metrics = result.metrics
    measured = (
        f"{metrics['tokens_per_s']:,.0f} tokens/s, {metrics['step_time_ms']:.1f} ms a step, final loss "
        f"{metrics.get('final_loss', float('nan')):.4f}; "
        if "tokens_per_s" in metrics and "step_time_ms" in metrics
        else ""
    )
    return (
        f"ghsweep: run {result.status}: {measured}report {Path(result.run_dir) / REPORT}; "
        f"MLflow run {result.mlflow_run_id} in experiment {experiment} at {tracking_uri}"
    )
