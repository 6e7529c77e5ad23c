"""One combination's run directory: the name of every file a stage writes there, in one place.

The job, the worker process, the profile analysis, tracking and the reports all meet in this
directory; they agree on file names by importing them from here.
"""

from __future__ import annotations

CONFIG = "config.yaml"  # the composed config, as Hydra saves it (.hydra/config.yaml is also kept)
OVERRIDES = "overrides.yaml"
RUN_PLAN = "run_plan.json"  # what the job decided for this combination; the worker reads it
WORKER_LOG = "worker.log"
# The worker log of an attempt that failed for its infrastructure and was run again (N = 1, 2, ...).
ATTEMPT_LOG = "worker.attempt{n}.log"
# The worker's pid, which is also its process group, and on a second line when it started
# (/proc/PID/stat): what stops it, and only it, if the sweep process dies first.
WORKER_PID = "worker.pid"
# Made by a local sweep once its work on the runs before this one is done (RunPlan.measure_after).
MEASURE_AFTER = "measure_after"
# The hand-off of a run's nsys collection between the sweep and its forked worker (core/handoff.py):
# the sweep has armed the collection (empty) or could not (why); the worker's capture has begun to
# stop; nsys is writing the report in its own process, so the worker may exit.
CAPTURE_ARMED = "capture_armed"
CAPTURE_STOPPING = "capture_stopping"
CAPTURE_MAY_EXIT = "capture_may_exit"
WORKER_ERROR = "worker_error.json"  # the worker's exception, one line, when training failed
SUMMARY = "summary.json"  # the worker's measurements (metrics, timing, info)
METRICS = "metrics.jsonl"  # one line per logged step
MEMORY_SNAPSHOT = "memory_snapshot.pickle"  # the CUDA allocator's snapshot, dumped on out of memory
SYSTEM_METRICS = "system_metrics.jsonl"  # the worker's GPU and host samples (train/system_metrics.py), one per rank
RESULT = "result.json"  # what the combination ended with (RunResult)
REPORT = "report.md"
PROFILE_ANALYSIS = "profile_analysis.json"
PROFILE_REPORT = "profile_report.md"
NCU_PASS_DIR = "ncu_pass"  # the short second run under Nsight Compute (profile=nsys_ncu)
TORCH_TRACE = "torch_trace.json"  # the PyTorch profiler's Chrome trace (profile=torch)
RECIPE_JSON = "recipe.json"  # NeMo's recipe as run (fiddle), to rebuild it
RECIPE_TXT = "recipe.txt"
AUTOMODEL_RECIPE = "automodel.yaml"  # the AutoModel recipe config the run trains with
# Nsight Systems' report and its SQLite export; with several ranks, one report per rank (nsys
# expands %q{RANK} from the rank's environment).
NSYS_REPORT = "profile.nsys-rep"
NSYS_SQLITE = "profile.sqlite"
NSYS_RANK_REPORT = "profile_rank%q{RANK}.nsys-rep"
NSYS_RANK_GLOB = "profile_rank*.nsys-rep"
NCU_REPORT = "top_kernels.ncu-rep"  # the Nsight Compute pass's report, in NCU_PASS_DIR
NCU_CSV = "top_kernels_ncu.csv"  # its raw metrics, in the run directory
TOP_KERNELS_TABLE = "top_kernels.md"
GAP_PLOT = "gap_histogram.png"
ROOFLINE_PLOT = "roofline.png"
# How rank N's SLURM task ended (launch/slurm/rank_reports.py), for rank 0 to record the run.
RANK_REPORT = "rank{rank}.json"
SLURM_JOBS = "ghsweep_jobs.json"  # SLURM job ids of a sweep, in its sweep directory
SWEEP_MANIFEST = "ghsweep_sweep.json"  # which sweep a sweep directory belongs to
# Locked by the live process of the sweep in the directory, for its life; holds that process's identity.
SWEEP_LOCK = ".ghsweep.lock"
SWEEP_SUMMARY = "summary.md"  # the sweep's table, as printed at its end
# How the sweep ended (its parent run's status and its failed runs), written by its end for
# `python -m ghsweep.status` to answer without asking MLflow; removed when the sweep resumes.
SWEEP_END = "ghsweep_end.json"
SWEEP_CONFIG = "multirun.yaml"  # the sweep's config, where Hydra's own sweepers save it
# The comparison report of a sweep: COMPARISON_DIR/comparison.{md,html} and its plots, in the sweep
# directory and on the parent run in MLflow.
COMPARISON_DIR = "comparison"
COMPARISON_STEM = "comparison"
# A tuning study's report in its sweep directory, and the command lines that reproduce its answer.
TUNE_DIR = "tune"
TUNE_REPORT = "tune.md"
TUNE_ANSWER = "best.txt"


def rank_file(name: str, rank: int) -> str:
    """A file of the run's rank `rank`: the name itself for rank 0, else name.rankN (worker.rank1.log)."""
    if rank == 0:
        return name
    stem, dot, suffix = name.partition(".")
    return f"{stem}.rank{rank}{dot}{suffix}"


# What a finished combination logs to MLflow from its directory, when present.
ARTIFACTS = (
    CONFIG,
    OVERRIDES,
    WORKER_LOG,
    REPORT,
    METRICS,
    SYSTEM_METRICS,
    MEMORY_SNAPSHOT,
    SUMMARY,
    RESULT,
    RECIPE_TXT,
    RECIPE_JSON,
)
