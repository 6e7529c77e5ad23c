"""Names that cross process and stage boundaries: MLflow tags and the NVTX step-range prefix."""

from __future__ import annotations

import shlex

# MLflow tag telling a sweep's parent run from its combinations' runs.
ROLE_TAG = "ghsweep.role"
ROLE_SWEEP = "sweep"
ROLE_RUN = "run"

# Every training step is an NVTX / record_function range named f"{STEP_RANGE_PREFIX}{n}"; the profile
# analysis finds steps by it and the job reads the worker's progress lines by it.
STEP_RANGE_PREFIX = "step "
# The ranges inside each step (train/phases.py records them, the profile analysis reads them).
PHASES = ("data", "forward", "backward", "optimizer")

# A run's info `measure_stop` when its trial was pruned (the worker stops, the tune sweeper reads it).
MEASURE_PRUNED = "pruned"

# Tags of ghsweep's MLflow runs that more than one stage writes or reads (the full list is in docs/).
RUN_DIR_TAG = "ghsweep.run_dir"
OVERRIDES_TAG = "ghsweep.overrides"  # the combination's overrides, as a shell would quote them (join_overrides)
JOB_NUM_TAG = "ghsweep.job_num"  # the combination's number in its sweep
STATUS_TAG = "ghsweep.status"
ERROR_TAG = "ghsweep.error"  # one line: why the run failed
FAILURE_CLASS_TAG = "ghsweep.failure_class"  # a failed run's: deterministic or infrastructure (core.failures)
PROFILE_ERROR_TAG = "ghsweep.profile_error"  # why the run's profile was not analysed (the training result stands)
ATTEMPTS_TAG = "ghsweep.attempts"  # how many times the run's worker was started (infrastructure failures retried)


HOST_TAG = "ghsweep.host"
RUN_HASH_TAG = "ghsweep.run_hash"  # the run's identity (its resolved config, code and inputs), for resume
CODE_TAG = "ghsweep.code"  # the code that ran it: ghsweep's version and the checkout's commit
INPUTS_TAG = "ghsweep.inputs"  # the digests of the input files it read (data.path, model.path), as JSON
SWEEP_DIR_TAG = "ghsweep.sweep_dir"
# Why a run was measured on a busy machine (train.system_metrics.contention); absent on a quiet one.
CONTENDED_TAG = "ghsweep.contended"
RUN_IDS_TAG = "ghsweep.run_ids"  # on a sweep's parent run: its runs' ids in job order, comma-separated
# The tags that tie an MLflow run to a tuning study's trial.
STUDY_TAG = "ghsweep.tune.study"
TRIAL_TAG = "ghsweep.tune.trial"

# The experiment's kind as MLflow records it: ghsweep's are model training (runs listed and compared),
# not GenAI (traces). MLflow's views without the UI's workflow switch read it.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
# A run's description in MLflow's UI (markdown), shown first on its page: a sweep's holds its verdict.
NOTE_TAG = "mlflow.note.content"


def join_overrides(overrides: list[str]) -> str:
    """The OVERRIDES_TAG text: quoted where an override holds a space (report.baseline="a=1 b=2")."""
    return shlex.join(overrides)


def split_overrides(text: str) -> list[str]:
    """join_overrides undone. A tag whose quoting does not parse splits on spaces, as it was written."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split(" ") if text else []


def attempt_tag(attempt: int) -> str:
    """The tag saying why attempt `attempt` (1, 2, ...) of a run failed and was retried."""
    return f"ghsweep.attempt.{attempt}"
