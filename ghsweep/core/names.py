"""Names that cross process and stage boundaries: MLflow tags and the NVTX step-range prefix."""

from __future__ import annotations

# MLflow tag telling a sweep's parent run from its combinations' runs.
ROLE_TAG = "ghsweep.role"
ROLE_SWEEP = "sweep"
ROLE_RUN = "run"

# Every training step is an NVTX / record_function range named f"{STEP_RANGE_PREFIX}{n}"; the profile
# analysis finds steps by it and the job reads the worker's progress lines by it.
STEP_RANGE_PREFIX = "step "
