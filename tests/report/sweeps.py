"""Small sweeps written into a real MLflow store the way ghsweep's jobs write them (tags, params,
metrics, loss history, analysis.json artifacts), with numbers chosen so the expected comparison is
known exactly."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.names import ERROR_TAG, JOB_NUM_TAG, OVERRIDES_TAG, ROLE_RUN, ROLE_SWEEP, join_overrides
from ghsweep.profile.result import Finding, ProfileAnalysis
from ghsweep.report.sweep_source import PROFILE_ARTIFACTS
from ghsweep.tracking.mlflow_store import MlflowStore

KERNELS = {
    "gemm_bf16": (6_000_000, 300),
    "flash_attn_fwd": (2_000_000, 100),
    "rmsnorm": (1_000_000, 400),
    "elementwise_add": (500_000, 800),
    "adamw_step": (400_000, 10),
    "cast_fp32_bf16": (300_000, 600),
}


def analysis(
    kernels: dict[str, tuple[int, int]],
    steps: int = 2,
    findings: list[Finding] | None = None,
    roofline: dict | None = None,
) -> ProfileAnalysis:
    total = sum(ns for ns, _ in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:5]
    return ProfileAnalysis(
        top_kernels=[
            {"name": n, "total_ns": ns, "count": c, "mean_ns": ns / c, "pct": 100 * ns / total} for n, (ns, c) in top
        ],
        window={"start_ns": 0, "end_ns": 10_000_000 * steps, "steps": steps},
        gpu_idle_pct=7.5,
        findings=findings or [],
        roofline=roofline or {},
    )


def log_run(
    store: MlflowStore,
    tmp: Path,
    parent: str | None,
    job: int,
    overrides: list[str],
    status: str,
    metrics: dict[str, float],
    loss: list[float],
    error: str | None = None,
    analysis: ProfileAnalysis | None = None,
    params: dict[str, str] | None = None,
) -> str:
    run_id = store.start_run(
        ",".join(overrides),
        ROLE_RUN,
        {JOB_NUM_TAG: str(job), OVERRIDES_TAG: join_overrides(overrides)},
        parent_run_id=parent,
    )
    store.log_params(run_id, {**dict(o.split("=", 1) for o in overrides), **(params or {})})
    store.log_metrics(run_id, [("loss", v, s) for s, v in enumerate(loss)] + [(k, v, 0) for k, v in metrics.items()])
    if error:
        store.set_tags(run_id, {ERROR_TAG: error})
    if analysis is not None:
        folder = tmp / run_id / "profile"
        folder.mkdir(parents=True)
        store.log_artifacts(run_id, [analysis.save(folder)], PROFILE_ARTIFACTS)
    store.finish(run_id, status)
    return run_id


def four_run_sweep(
    store: MlflowStore, tmp: Path, name: str = "sweep 2026-01-01/00-00-00"
) -> tuple[MlflowStore, str, list[str]]:
    """#0 fp32/off, #1 fp32/on, #2 bf16/off (fastest), #3 fp8 FAILED."""
    parent = store.start_run(name, ROLE_SWEEP, {})
    slow_kernels = {**KERNELS, "gemm_bf16": (12_000_000, 300)}
    ids = [
        log_run(
            store,
            tmp,
            parent,
            0,
            ["precision=fp32", "offload=off"],
            "FINISHED",
            {"step_time_ms": 200.0, "tokens_per_s": 1000.0, "peak_mem_gb": 10.0, "tflops_per_gpu": 50.0},
            [4.0, 3.5, 3.0],
            analysis=analysis(slow_kernels),
        ),
        log_run(
            store,
            tmp,
            parent,
            1,
            ["precision=fp32", "offload=on"],
            "FINISHED",
            {"step_time_ms": 250.0, "tokens_per_s": 800.0, "peak_mem_gb": 6.0},
            [4.0, 3.6, 3.1],
            analysis=analysis(
                slow_kernels,
                findings=[
                    Finding("gpu_starved", "info", "GPU busy 80%"),
                    Finding("offload_cost", "warning", "offload adds 12 ms of exposed copies"),
                ],
            ),
        ),
        log_run(
            store,
            tmp,
            parent,
            2,
            ["precision=bf16", "offload=off"],
            "FINISHED",
            {"step_time_ms": 100.0, "tokens_per_s": 2000.0, "peak_mem_gb": 8.0},
            [4.0, 3.4, 2.9],
            analysis=analysis(KERNELS),
        ),
        log_run(
            store,
            tmp,
            parent,
            3,
            ["precision=fp8", "offload=off"],
            "FAILED",
            {},
            [],
            error="precision=fp8: needs an NVIDIA GPU of compute capability >= 8.9",
        ),
    ]
    store.finish(parent, "FAILED")
    return store, parent, ids
