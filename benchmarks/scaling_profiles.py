"""Where the per-GPU throughput went, from a sweep's Nsight Systems exports of the same
combinations on 1 and on N GPUs (benchmarks/h200x2_scaling.sh makes such a sweep).

    python benchmarks/scaling_profiles.py SWEEP_DIR --out DIR

For every finished run with nsys exports, its exports are copied to
DIR/<combination>_<N>gpu/profile_rank<R>.sqlite.gz, trimmed to the tables the analysis reads
(small enough to keep as test data), with the run's summary.json (its measured step, against which
the profiler's own overhead is told apart); DIR/decomposition.json holds, per combination, the split of
the step time gained from 1 to N GPUs (ghsweep/profile/scaling.py) as analysed from those trimmed
copies. <combination> is the values of the overrides that differ between the sweep's runs (the
world left out), e.g. "lora" or "none" for peft=lora,none. The tables are printed last.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from ghsweep.core.run_dir import NSYS_SQLITE, RESULT, SUMMARY
from ghsweep.core.run_result import RunResult
from ghsweep.profile.scaling import folder_decompositions, headline, kernel_table, table
from ghsweep.report.compare import WORLD_KEYS

# What the analysis reads of an export (nsys_analysis.py, nsys_db.py); the rest (OS runtime calls,
# sampling, GPU metrics) is most of a capture's size.
KEPT_TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS",
    "META_DATA_EXPORT",
    "META_DATA_CAPTURE",
    "TARGET_INFO_GPU",
)
RANK_FILE = "profile_rank{rank}.sqlite.gz"  # scaling.folder_decompositions reads these


def trimmed(export: Path, out: Path) -> Path:
    """`export` with KEPT_TABLES only, gzipped to `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "trimmed.sqlite"
        con = sqlite3.connect(small)
        con.execute("ATTACH DATABASE ? AS big", (f"file:{export}?mode=ro",))
        for table in KEPT_TABLES:
            row = con.execute(
                "SELECT sql FROM big.sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            if row:
                con.execute(row[0])
                con.execute(f"INSERT INTO main.{table} SELECT * FROM big.{table}")
        con.commit()
        con.execute("DETACH DATABASE big")
        con.execute("VACUUM")
        con.close()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(gzip.compress(small.read_bytes(), mtime=0))
    return out


def exports_of(run_dir: Path) -> list[Path]:
    ranks = sorted(run_dir.glob("profile_rank*.sqlite"), key=lambda p: int(re.findall(r"\d+", p.name)[-1]))
    return ranks or ([run_dir / NSYS_SQLITE] if (run_dir / NSYS_SQLITE).is_file() else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = [(p.parent, RunResult.load(p.parent)) for p in sorted(args.sweep_dir.glob(f"*/{RESULT}"))]
    finished = [(d, r) for d, r in results if r.status == "FINISHED" and exports_of(d)]
    if not finished:
        print(f"{args.sweep_dir}: no finished run with nsys exports (profile.sqlite, profile_rank<N>.sqlite)")
        return 2

    def knobs(r: RunResult) -> dict[str, str]:
        return dict(o.partition("=")[::2] for o in r.overrides if not o.startswith(WORLD_KEYS))

    # What varies over the whole sweep (failed runs too), so a folder's name does not depend on which runs failed.
    every = [knobs(r) for _, r in results]
    varying = sorted({k for k in set().union(*every) if len({kn.get(k) for kn in every}) > 1})
    for run_dir, result in finished:
        knob = knobs(result)
        exports = exports_of(run_dir)
        combination = "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", knob.get(k, "")) for k in varying) or "run"
        folder = args.out / f"{combination}_{len(exports)}gpu"
        for rank, export in enumerate(exports):
            out = trimmed(export, folder / RANK_FILE.format(rank=rank))
            print(f"{export} -> {out} ({out.stat().st_size / 1e6:.2f} MB)")
        if (run_dir / SUMMARY).is_file():  # the measured (untraced) step: the profiler's overhead against it
            shutil.copyfile(run_dir / SUMMARY, folder / SUMMARY)
    found = folder_decompositions(args.out)
    (args.out / "decomposition.json").write_text(json.dumps(found, indent=2))
    for combination, d in found.items():
        print(f"\n{combination}: {headline(d)}")
        for header, rows in (table(d), kernel_table(d)):
            widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
            for line in (header, *rows):
                print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)))
            print()
    return 0 if found else 2


if __name__ == "__main__":
    sys.exit(main())
