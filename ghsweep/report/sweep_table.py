"""The table a multirun prints at its end: one row per combination."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ghsweep.core.run_result import RunResult

# A value longer than this is cut where it reaches a table, a plot's label or a report (a 10,000-character
# `+notes.a=...` grew the speedup plot to 10 MB and drawing it to 19 GB).
LABEL_CHARS = 48


def bounded(text: str, limit: int = LABEL_CHARS) -> str:
    """`text`, or its first characters and how long it was."""
    return text if len(text) <= limit else f"{text[: limit - 16]}… ({len(text):,} chars)"


def knob_values(overrides: Sequence[str]) -> dict[str, str]:
    """{key: value} of a combination's overrides, each value bounded for tables and labels."""
    return {key: bounded(value) for key, _, value in (o.partition("=") for o in overrides)}


def knob_columns(overrides: Sequence[Sequence[str]]) -> list[str]:
    """Override keys that differ between combinations (one list of overrides each), in the order first seen."""
    values: dict[str, set[str]] = {}
    for combination in overrides:
        for o in combination:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    varying = [k for k, v in values.items() if len(v) > 1]
    return varying or list(values)


def fmt_value(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def format_table(results: list[RunResult], width: int | None = None) -> str:
    """One row per combination; with `width`, its lines cut to it (align)."""
    keys = knob_columns([r.overrides for r in results])
    header = ["#", *keys, "status", "step_ms", "tokens/s", "tokens/J", "peak_GiB", "final_loss", "overhead_s", "reason"]
    rows = []
    for i, r in enumerate(results):
        knobs = knob_values(r.overrides)
        m = r.metrics
        rows.append(
            [
                str(i),
                *(knobs.get(k, "-") for k in keys),
                r.status,
                fmt_value(m.get("step_time_ms"), ".1f"),
                fmt_value(m.get("tokens_per_s"), ",.0f"),
                fmt_value(m.get("tokens_per_joule"), ".3g"),
                fmt_value(m.get("peak_mem_gb"), ".2f"),
                fmt_value(m.get("final_loss"), ".4f"),
                fmt_value(r.timing.get("overhead_s"), ".1f"),
                r.error or (f"reused: FINISHED earlier as MLflow run {r.mlflow_run_id}" if r.reused else ""),
            ]
        )
    return align(header, rows)


# The terminal width the end of a sweep fits in.
TERMINAL_COLUMNS = 120


def align(header: list[str], rows: list[list[str]], width: int | None = None) -> str:
    """A plain-text table, columns padded to their widest cell; with `width`, the last column (reasons,
    findings: whole in the report, the summary file and MLflow) cut where a line would pass it, and
    left out where not even its header fits; the column before it is then the last, cut in its turn."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    if width is not None and len(header) > 1 and sum(w + 2 for w in widths[:-1]) + len(header[-1]) > width:
        header, rows, widths = header[:-1], [row[:-1] for row in rows], widths[:-1]

    # The last column is left unpadded so long text wraps in the terminal, not the table.
    def line(cells: list[str]) -> str:
        padded = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths[:-1])) + "  "
        last = cells[-1]
        if width is not None and last and len(padded) + len(last) > width:
            last = last[: max(width - len(padded) - 1, 0)] + "…"
        return (padded + last).rstrip()

    # The last column's rule as wide as what of it fits.
    room = widths[-1] if width is None else min(widths[-1], width - sum(w + 2 for w in widths[:-1]))
    rule = ["-" * w for w in widths[:-1]] + ["-" * room]
    return "\n".join([line(header), line(rule), *(line(r) for r in rows)])
