"""Python's garbage collector against the step-time spread: `python benchmarks/gc_pauses.py SWEEP_DIR`.

Prints, for each run of a sweep (e.g. `train.gc_interval=null,50 repeat=1,2`), its tokens/s with the
interval, the steady steps it took to reach it, and the collections' pauses in those steps
(gc_pause_ms_per_step, gc_pause_max_ms, gc_full_collections: ghsweep/train/gc_pauses.py). A run whose
spread falls with the interval's collections is one the collector was slowing down.
`bash benchmarks/gc_pauses.sh OUT` runs the sweep on the 7B shape (fp8 with offload, the noisiest
combination of the default line) and prints this table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ghsweep.core.run_result import sweep_results


def rows(sweep_dir: Path) -> list[dict]:
    """One row per run of `sweep_dir` that measured, in job order."""
    return [
        {"run": " ".join(o for o in result.overrides if not o.startswith(("hydra.", "tracking."))), **result.metrics}
        for _, result in sweep_results(sweep_dir)
        if result.metrics
    ]


def table(found: list[dict]) -> str:
    header = ("run", "tokens/s", "±%", "steady steps", "gc ms/step", "longest gc pause ms", "full collections")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for r in found:
        lines.append(
            " | ".join(
                [
                    r["run"],
                    f"{r.get('tokens_per_s', 0):,.0f}",
                    f"{r.get('tokens_per_s_ci_pct', float('nan')):.2f}",
                    f"{r.get('steady_steps', 0):.0f}",
                    f"{r.get('gc_pause_ms_per_step', float('nan')):.2f}",
                    f"{r.get('gc_pause_max_ms', float('nan')):.1f}",
                    f"{r.get('gc_full_collections', float('nan')):.0f}",
                ]
            )
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    found = rows(args.sweep_dir)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    print(table(found))


if __name__ == "__main__":
    main()
