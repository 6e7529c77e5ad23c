"""What a profile analysis holds, for every reader of it: the metrics it logs and their order."""

from __future__ import annotations

# The analysis' numbers logged as MLflow metrics and shown in the profile report, in this order
# (one vocabulary for every backend and profiler).
METRICS = ("gpu_busy_pct", "gpu_idle_pct", "idle_gaps_per_step", "kernel_time_pct", "memcpy_time_pct",
           "memset_time_pct", "exposed_memcpy_pct", "um_migration_pct", "h2d_gb", "d2h_gb", "nccl_time_pct",
           "exposed_nccl_pct")
