"""What a run records of its health: a loss that becomes NaN or infinite ends it FAILED at that step
with one line and the sweep goes on; every run, finished or failed, samples its system metrics
(host CPU and memory on a CPU) into MLflow's System metrics and summarises them in summary.json.

The diverging run is a real one: full fine-tuning in fp16 at a learning rate of 0.9 without
gradient clipping overflows fp16 within a few steps (the tiny model's loss is NaN by the third to fifth step).
"""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest
import torch

from ghsweep.core.errors import NonFiniteLoss
from ghsweep.train.step_log import StepLog
from ghsweep.train.system_metrics import (
    HostSampler,
    SystemSampler,
    mean_power_w,
    read_samples,
    summarise,
    system_summary,
)
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords, sqlite_uri

DIVERGING = ["peft=none", "precision=fp16", "train.grad_clip=null", "train.lr_schedule=constant", "train.max_steps=10"]


def test_flush_stops_at_the_first_non_finite_loss(tmp_path):
    log = StepLog(tmp_path / "metrics.jsonl", torch.device("cpu"), tokens_per_step=64)
    for step, loss in enumerate([2.0, 1.5, math.inf, math.nan]):
        log.end(step, torch.tensor(loss), log.start())
    with pytest.raises(NonFiniteLoss, match=r"^loss became inf at step 3$"):
        log.flush()
    log.close()
    # The steps up to the bad one are on record; the step after it is not.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


@pytest.fixture(scope="module")
def diverging_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("diverging")
    # A flush every step: the finished run has a steady window for its means.
    proc = run_cli(["-m", *DIVERGING, "train.lr=0.9,0.0001", "system_metrics.interval_s=0.2", "train.log_every=1"], cwd)
    return cwd, proc


def test_diverging_run_fails_at_its_step_and_the_sweep_goes_on(diverging_sweep):
    cwd, proc = diverging_sweep
    runs = {r.data.params["train.lr"]: r for r in MlflowRecords(sqlite_uri(cwd)).runs("run")}
    assert set(runs) == {"0.9", "0.0001"}, proc.stderr[-3000:]
    diverged, fine = runs["0.9"], runs["0.0001"]
    assert diverged.data.tags["ghsweep.status"] == "FAILED"
    bad_step = re.fullmatch(r"NonFiniteLoss: loss became nan at step (\d+)", diverged.data.tags["ghsweep.error"])
    assert bad_step, diverged.data.tags["ghsweep.error"]
    assert fine.data.tags["ghsweep.status"] == "FINISHED"
    assert math.isfinite(fine.data.metrics["final_loss"])
    # Its losses up to the bad step are recorded, the bad one last.
    history = MlflowRecords(sqlite_uri(cwd)).client.get_metric_history(diverged.info.run_id, "loss")
    assert [m.step for m in history] == list(range(int(bad_step[1]))) and math.isnan(history[-1].value)
    assert all(math.isfinite(m.value) for m in history[:-1])


HOST = (
    "cpu_utilization_percentage",
    "cpu_others_percentage",
    "system_memory_usage_megabytes",
    "system_memory_usage_percentage",
)


def test_every_run_logs_host_metrics_over_time_even_a_failed_one(diverging_sweep):
    cwd, _ = diverging_sweep
    records = MlflowRecords(sqlite_uri(cwd))
    for run in records.runs("run"):
        for name in HOST:
            history = records.client.get_metric_history(run.info.run_id, f"system/{name}")
            assert len(history) >= 2, (run.data.params["train.lr"], name)
            assert [m.step for m in history] == list(range(len(history)))
            stamps = [m.timestamp for m in history]
            assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
        # A CPU run: no GPU series; the summaries (NAME_mean, NAME_peak) stay out of the System metrics tab.
        assert {k for k in run.data.metrics if k.startswith("system/")} == {f"system/{n}" for n in HOST}


def test_summary_has_the_mean_and_peak_and_says_host_only(diverging_sweep):
    cwd, _ = diverging_sweep
    (summary_file,) = cwd.glob("multirun/*/*/*/summary.json")  # the finished run's
    summary = json.loads(summary_file.read_text())
    samples = read_samples(summary_file.parent / "system_metrics.jsonl")
    memory = [r["system_memory_usage_megabytes"] for r in samples]
    assert summary["metrics"]["system_memory_usage_megabytes_peak"] == max(memory)
    # The mean over the steady steps (the samples taken while they ran), the peak over the whole run.
    start, end = summary["timing"]["steady_from"], summary["timing"]["steady_to"]
    steady = [r["system_memory_usage_megabytes"] for r in samples if start <= r["time"] <= end]
    assert steady and len(steady) < len(memory)
    assert summary["metrics"]["system_memory_usage_megabytes_mean"] == pytest.approx(sum(steady) / len(steady))
    assert 0 < summary["metrics"]["cpu_utilization_percentage_mean"] <= 100
    assert summary["info"]["system_metrics"] == "host only (no GPU)"
    assert "tokens_per_joule" not in summary["metrics"]


def test_mean_power_reads_the_energy_counter_else_the_power_samples():
    # Planted samples of rank 1's GPU: 300 W by the counter between t=11 and t=13 (600 J in 2 s).
    rows = [
        {"time": 10.0, "gpu_1_power_usage_watts": 100.0, "gpu_1_energy_joules": 0.0},
        {"time": 11.0, "gpu_1_power_usage_watts": 280.0, "gpu_1_energy_joules": 200.0},
        {"time": 12.0, "gpu_1_power_usage_watts": 320.0, "gpu_1_energy_joules": 500.0},
        {"time": 13.0, "gpu_1_power_usage_watts": 310.0, "gpu_1_energy_joules": 800.0},
    ]
    assert mean_power_w(rows, 1, 10.5, 13.0) == (300.0, "nvml_energy_counter")
    without_counter = [{k: v for k, v in r.items() if "energy" not in k} for r in rows]
    assert mean_power_w(without_counter, 1, 10.5, 13.0) == (pytest.approx(910 / 3), "power_samples")
    assert mean_power_w(rows, 0, 10.5, 13.0) is None
    assert summarise(rows)["gpu_1_energy_joules"] == 800.0
    # Means over the steady steps where they hold samples (start-up's low power left out); peaks over the run.
    assert summarise(rows)["gpu_1_power_usage_watts_mean"] == pytest.approx(1010 / 4)
    steady = summarise(rows, (10.5, 13.0))
    assert steady["gpu_1_power_usage_watts_mean"] == pytest.approx(910 / 3)
    assert steady["gpu_1_power_usage_watts_peak"] == 320.0
    assert summarise(rows, (50.0, 60.0))["gpu_1_power_usage_watts_mean"] == pytest.approx(1010 / 4)


def test_planted_gpu_samples_give_energy_per_step_and_tokens_per_joule(tmp_path):
    sampler = SystemSampler(tmp_path / "system_metrics.jsonl", 1.0, gpu_index=None, rank=0, host=False)
    sampler.handle = object()  # as if NVML saw a GPU: the summary reads only the file below
    rows = [{"time": 100.0 + t, "gpu_0_power_usage_watts": 400.0, "gpu_0_energy_joules": 400.0 * t} for t in range(6)]
    sampler.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {"world_size": 2, "step_time_ms": 250.0, "tokens_per_s": 8000.0}
    added, info = system_summary(sampler, metrics, {"steady_from": 101.0, "steady_to": 105.0})
    assert added["gpu_power_w"] == 400.0
    # Two GPUs at 400 W for a 0.25 s step; 8000 tokens/s over 800 W.
    assert added["energy_j_per_step"] == 200.0 and added["tokens_per_joule"] == 10.0
    assert added["steady_energy_j"] == 3200.0
    assert info == {"system_metrics": "gpu and host", "energy_measured_by": "nvml_energy_counter"}


def planted_summary(tmp_path, rows: list[dict[str, float]]) -> dict:
    sampler = SystemSampler(tmp_path / "system_metrics.jsonl", 1.0, gpu_index=None, rank=0, host=False)
    sampler.handle = object()  # as if NVML saw a GPU: the summary reads only the file below
    sampler.path.write_text("".join(json.dumps({"time": 100.0 + t, **r}) + "\n" for t, r in enumerate(rows)))
    metrics = {"world_size": 1, "step_time_ms": 250.0, "tokens_per_s": 8000.0}
    return system_summary(sampler, metrics, {"steady_from": 101.0, "steady_to": 105.0})[1]


def test_planted_samples_of_a_busy_machine_mark_the_run_contended(tmp_path):
    # The steady steps (t=101..105): others take 45% of the host's CPU, a second process shares the
    # GPU once, its clocks are slowed in 2 of 5 samples. Start-up's samples (t=100) count for no mean.
    busy = [{"cpu_others_percentage": 90.0, "gpu_0_other_processes": 0.0, "gpu_0_clocks_slowed": 0.0}]
    busy += [
        {"cpu_others_percentage": 45.0, "gpu_0_other_processes": float(t == 3), "gpu_0_clocks_slowed": float(t < 2)}
        for t in range(5)
    ]
    assert planted_summary(tmp_path, busy)["contended"] == (
        "other processes used 45% of the host's CPU; 1 other process(es) on its GPU; its GPU's clocks slowed "
        "by heat or hardware 40% of the time"
    )
    # A quiet machine: a little background CPU, one slowed sample in ten, the GPU its own.
    quiet = [
        {"cpu_others_percentage": 5.0, "gpu_0_other_processes": 0.0, "gpu_0_clocks_slowed": float(t == 0)}
        for t in range(11)
    ]
    assert "contended" not in planted_summary(tmp_path, quiet)
    # Another process on its GPU during start-up only (t=100: the sweep's compile-ahead workers beside a
    # worker's compile), none while it measured: its measurements are its own.
    beside_start = [{**row, "gpu_0_other_processes": float(t == 0)} for t, row in enumerate(quiet)]
    assert "contended" not in planted_summary(tmp_path, beside_start)


def test_the_host_sampler_leaves_the_worker_s_own_cpu_out_of_the_others():
    sampler = HostSampler()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # this process busy on one core
        pass
    sample = sampler.sample()
    own = sample["cpu_utilization_percentage"] - sample["cpu_others_percentage"]
    assert 0 <= sample["cpu_others_percentage"] <= sample["cpu_utilization_percentage"]
    assert own >= 10.0 / max(1, (os.cpu_count() or 1) / 2), sample  # a share of the host's cores was its own
