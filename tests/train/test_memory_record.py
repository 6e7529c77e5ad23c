"""A CUDA out-of-memory error in one line, and (on a GPU) the allocator's snapshot it leaves.

The CPU test reads torch's own message; the GPU tests run a real worker out of memory.
Run those on a GPU machine with `pytest -m gpu tests/train/test_memory_record.py`.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import visible_gpu_handles
from ghsweep.launch.run_planner import checked_config
from ghsweep.train import memory_record
from ghsweep.train.memory_record import largest_sites, oom_line, sites_text
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.planned_run import planned_run

DATA = Path(__file__).resolve().parents[1] / "data" / "memory"
# torch 2.x's message for a failed allocation (c10/cuda/CUDACachingAllocator.cpp), as a 7B run prints it.
TORCH_MESSAGE = (
    "CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. Of the "
    "allocated memory 74.20 GiB is allocated by PyTorch, and 3.41 GiB is reserved by PyTorch but unallocated."
)


def test_oom_line_names_requested_allocated_reserved_and_total_gib():
    line = oom_line(TORCH_MESSAGE, allocated=74 * 2**30, reserved=int(77.5 * 2**30), total=int(79.19 * 2**30))
    assert line == (
        "CUDA out of memory: requested 3.91 GiB with 74.00 GiB allocated, 77.50 GiB reserved, 79.19 GiB total"
    )
    assert "\n" not in line
    small = oom_line("CUDA out of memory. Tried to allocate 512.00 MiB.", 0, 2**30, 80 * 2**30)
    assert "requested 0.50 GiB" in small
    assert "requested an unknown size" in oom_line("out of memory", 0, 0, 1)


def test_the_largest_live_allocations_are_named_by_where_they_were_made():
    # The snapshot a real out-of-memory run left on one H100 (benchmarks/hardware_metrics.sh): the
    # tiny model with an 8.4M-token step, 52.13 GiB allocated when 10.75 GiB more was asked.
    snapshot = pickle.loads((DATA / "oom_snapshot_h100.pickle").read_bytes())
    every = largest_sites(snapshot, top=1000)
    assert sum(size for _, size in every) == pytest.approx(52.13 * 2**30, rel=1e-3)
    # Named by the first frame outside torch's own modules (the LoRA layer's forward, not nn.Linear's),
    # even where torch is installed under a folder of that name (/opt/torch/.venv/...).
    assert [(site, round(size / 2**30, 2)) for site, size in largest_sites(snapshot)] == [
        ("layer.py:1088 forward", 10.75),
        ("modeling_llama.py:64 forward", 8.0),
        ("modeling_llama.py:67 forward", 8.0),
    ]
    assert sites_text(largest_sites(snapshot, top=1)) == "; most memory held by layer.py:1088 forward 10.75 GiB"
    assert sites_text([]) == ""


gpu = pytest.mark.gpu
# A step of 8.4M tokens (40,000 records pack into ~4,800 blocks of 2,048 tokens): the tiny model's
# activations need hundreds of GiB, more than any GPU has.
OUT_OF_MEMORY = (
    "data.num_examples=40000",
    "data.packing_mask=causal",
    "train.compile=false",
    "train.seq_length=2048",
    "train.micro_batch_size=4096",
    "train.max_steps=2",
    "train.warmup_steps=1",
)


def run_worker(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    cfg = compose_config("device=cuda", "profile=none", *overrides)
    planned_run(tmp_path, cfg)
    return subprocess.run([sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)], capture_output=True, text=True)


@gpu
def test_an_out_of_memory_run_fails_in_one_line_and_leaves_its_snapshot(tmp_path):
    proc = run_worker(tmp_path, *OUT_OF_MEMORY)
    assert proc.returncode == 1
    error = json.loads((tmp_path / "worker_error.json").read_text())
    assert error["type"] == "OutOfMemoryError"
    assert re.fullmatch(
        r"CUDA out of memory: requested [\d.]+ GiB with [\d.]+ GiB allocated, [\d.]+ GiB reserved, [\d.]+ GiB total; "
        r"most memory held by .+ [\d.]+ GiB",
        error["message"],
    ), error["message"]
    snapshot = pickle.loads((tmp_path / "memory_snapshot.pickle").read_bytes())
    # memory_viz's format: the allocator's segments, and the history of allocations recorded so far.
    assert "segments" in snapshot and snapshot["device_traces"] and snapshot["device_traces"][0]


@gpu
def test_a_gpu_run_records_its_gpu_metrics_energy_and_peak_breakdown(tmp_path):
    proc = run_worker(tmp_path, "train.max_steps=60", "train.log_every=5", "system_metrics.interval_s=0.1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    metrics = summary["metrics"]
    for name in ("utilization_percentage", "memory_usage_megabytes", "power_usage_watts", "sm_clock_mhz"):
        assert f"gpu_0_{name}_peak" in metrics, name
    assert summary["info"]["system_metrics"] == "gpu and host"
    assert metrics["gpu_power_w"] > 0 and metrics["tokens_per_joule"] > 0
    assert summary["info"]["energy_measured_by"] in ("nvml_energy_counter", "power_samples")
    # Which card measured it, as NVML (and nvidia-smi) names it.
    [handle] = visible_gpu_handles()[:1]
    assert summary["info"]["device_uuid"] == pynvml.nvmlDeviceGetUUID(handle)
    # The peak broken down. Weights, optimizer state and the activations of a forward pass are all alive
    # at its end, so they fit under the peak; "other" is what the four parts leave of it.
    gb = {p: metrics[f"peak_{p}_gb"] for p in ("params", "grads", "optimizer_state", "activations", "other")}
    assert all(v >= 0 for v in gb.values()) and gb["activations"] > 0 and gb["params"] > 0
    assert gb["params"] + gb["optimizer_state"] + gb["activations"] <= metrics["peak_mem_gb"] + 1e-6
    known = gb["params"] + gb["grads"] + gb["optimizer_state"] + gb["activations"]
    assert gb["other"] == pytest.approx(max(0.0, metrics["peak_mem_gb"] - known))


def test_profile_memory_is_refused_on_cpu_and_before_step_2(tmp_path):
    proc = run_cli(["profile=memory", "device=cpu"], tmp_path)
    assert proc.returncode != 0
    assert "profile=memory: the CUDA allocator's history needs a GPU and this run has none (device=cpu)" in proc.stderr
    # Where it is decided, as the CLI's plan checks it: the config's own check.
    with pytest.raises(ConfigError, match=r"^capture.start_step=1: profile=memory records from step 2 on"):
        checked_config(compose_config("profile=memory", "capture.start_step=1"), None)


@gpu
def test_profile_memory_dumps_the_capture_windows_history(tmp_path):
    cfg = compose_config(
        "device=cuda", "profile=memory", "train.max_steps=8", "capture.start_step=4", "capture.num_steps=2"
    )
    planned_run(tmp_path, cfg, profiler="memory")
    proc = subprocess.run([sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    snapshot = pickle.loads((tmp_path / "memory_snapshot.pickle").read_bytes())
    events = snapshot["device_traces"][0]
    assert events and {e["action"] for e in events} >= {"alloc", "free_completed"}


def test_the_history_is_stopped_only_where_it_was_started(monkeypatch):
    # memory=unified's managed-memory allocator raises at any call to record a history, so a worker
    # that never started one (memory=unified, several ranks) must not stop one at step 2 either.
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(k))
    memory_record.stop_history()
    assert calls == []
    memory_record.start_history()
    memory_record.stop_history()
    memory_record.stop_history()
    assert [("enabled" in k) for k in calls] == [False, True]
