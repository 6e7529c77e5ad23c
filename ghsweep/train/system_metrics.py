"""The worker's system metrics: its own GPU (through NVML) and, on rank 0, the host (through psutil),
sampled by a thread every `system_metrics.interval_s` seconds into system_metrics.jsonl.

Names are MLflow's system-metrics names (mlflow/system_metrics/metrics/*.py), which the job logs
under `system/` so MLflow's System metrics view shows them: `gpu_{i}_utilization_percentage`,
`gpu_{i}_memory_usage_megabytes`, `gpu_{i}_memory_usage_percentage`, `gpu_{i}_power_usage_watts`,
`gpu_{i}_power_usage_percentage`, `cpu_utilization_percentage`, `system_memory_usage_megabytes`,
`system_memory_usage_percentage`; and in the same style `gpu_{i}_sm_clock_mhz`,
`gpu_{i}_temperature_celsius` and `gpu_{i}_energy_joules` (NVML's energy counter since the sampler
started, where the GPU has one). `i` is the rank: one GPU per rank, so on several GPUs or nodes each
rank's GPU has its own name. A sampler that cannot read something leaves it out and goes on: a
run's record never depends on NVML.

What tells a busy machine from a knob's effect (`contention`): `cpu_others_percentage`, the host's
CPU use less the worker's own (its process and children), `gpu_{i}_other_processes`, the processes
on the rank's GPU that are not the worker's, and `gpu_{i}_clocks_slowed`, 1 while the GPU's clocks
are held down by heat or a hardware slowdown (not by its power cap, which a full load meets anyway).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pynvml

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.gpu import visible_gpu_handles
from ghsweep.core.run_dir import SYSTEM_METRICS, rank_file
from ghsweep.core.run_plan import RunPlan

GPU_FIELDS = (
    "utilization_percentage",
    "memory_usage_megabytes",
    "memory_usage_percentage",
    "power_usage_watts",
    "power_usage_percentage",
    "sm_clock_mhz",
    "temperature_celsius",
)
HOST_FIELDS = ("cpu_utilization_percentage", "system_memory_usage_megabytes", "system_memory_usage_percentage")
# NVML's clock event reasons that slow a GPU whatever runs on it: heat, a hardware slowdown, the power brake.
SLOWED = (
    pynvml.nvmlClocksThrottleReasonHwSlowdown
    | pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    | pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
)
# A run measured while other processes took this share of the host's CPU (steady steps' mean, in
# percent of all cores), or its GPU was shared or slowed in this share of the samples, is `contended`.
CPU_OTHERS_LIMIT_PCT = 20.0
SLOWED_LIMIT = 0.1


def gpu_sample(handle: Any) -> dict[str, float]:
    """What NVML tells of one GPU now; a reading the GPU or driver does not support is left out."""
    readings = {
        "utilization_percentage": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        "memory": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "power_usage_watts": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "power_limit_watts": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "temperature_celsius": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "energy_millijoules": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        "processes": lambda: [
            *pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
            *pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
        ],
    }
    got: dict[str, Any] = {}
    for name, read in readings.items():
        try:
            got[name] = read()
        except pynvml.NVMLError:
            continue
    sample = {k: float(v) for k, v in got.items() if k in GPU_FIELDS}
    if "reasons" in got:
        sample["clocks_slowed"] = float(bool(got["reasons"] & SLOWED))
    if "processes" in got:
        own = own_pids()
        pids = {p.pid for p in got["processes"]}
        # NVML names processes by the host's pids: in a container none is the worker's, and nothing is known.
        if pids & own:
            sample["other_processes"] = float(len(pids - own))
    if "memory" in got:
        sample["memory_usage_megabytes"] = got["memory"].used / 1e6
        sample["memory_usage_percentage"] = 100 * got["memory"].used / got["memory"].total
    if "power_usage_watts" in got and got.get("power_limit_watts"):
        sample["power_usage_percentage"] = 100 * got["power_usage_watts"] / got["power_limit_watts"]
    if "energy_millijoules" in got:
        sample["energy_joules"] = got["energy_millijoules"] / 1000
    return sample


def own_pids() -> set[int]:
    """The worker's process and its children (data loader workers, compile workers)."""
    me = psutil.Process()
    return {me.pid, *(c.pid for c in me.children(recursive=True))}


def own_cpu_s() -> float:
    """CPU seconds the worker's process and its live children have used."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system and those of its waited-for children
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            continue
    return total


class HostSampler:
    """The host's CPU and memory use, and the CPU use of everything but the worker, since the
    previous sample (the first call primes it)."""

    def __init__(self) -> None:
        psutil.cpu_percent()
        self._own_s, self._at = own_cpu_s(), time.monotonic()

    def sample(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        host_pct = psutil.cpu_percent()
        own_s, at = own_cpu_s(), time.monotonic()
        own_pct = 100 * (own_s - self._own_s) / max(at - self._at, 1e-6) / (psutil.cpu_count() or 1)
        self._own_s, self._at = own_s, at
        return {
            "cpu_utilization_percentage": host_pct,
            "cpu_others_percentage": max(0.0, host_pct - own_pct),
            "system_memory_usage_megabytes": memory.used / 1e6,
            "system_memory_usage_percentage": 100 * memory.used / memory.total,
        }


def contention(metrics: dict[str, float], sharing: float | None, rank: int = 0) -> str | None:
    """Why the run's measurements are the machine's as much as its knobs' (a summary's `NAME_mean`,
    and `sharing`: the most other processes on its GPU at once while it measured), in words; None on
    a quiet machine."""
    reasons = []
    others = metrics.get("cpu_others_percentage_mean")
    if others is not None and others >= CPU_OTHERS_LIMIT_PCT:
        reasons.append(f"other processes used {others:.0f}% of the host's CPU")
    if sharing:
        reasons.append(f"{sharing:.0f} other process(es) on its GPU")
    slowed = metrics.get(f"gpu_{rank}_clocks_slowed_mean")
    if slowed is not None and slowed >= SLOWED_LIMIT:
        reasons.append(f"its GPU's clocks slowed by heat or hardware {slowed:.0%} of the time")
    return "; ".join(reasons) or None


class SystemSampler:
    """A daemon thread writing one JSON line per sample: {"time": epoch s, NAME: value, ...}."""

    def __init__(self, path: Path, interval_s: float, gpu_index: int | None, rank: int, host: bool):
        """`gpu_index`: the rank's GPU among those CUDA shows the process (None: a CPU run);
        `rank`: the name's `i`; `host`: sample the host too (one process per node should)."""
        self.path, self.interval_s, self.rank, self.host = path, interval_s, rank, host
        handles = visible_gpu_handles() if gpu_index is not None else []
        self.handle = handles[gpu_index] if gpu_index is not None and gpu_index < len(handles) else None
        # Set when this run has a GPU NVML cannot see (no driver library, CUDA_VISIBLE_DEVICES it cannot map).
        self.gpu_unseen = gpu_index is not None and self.handle is None
        self._energy_at_start: float | None = None
        self._host: HostSampler | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ghsweep-system-metrics", daemon=True)

    def sample(self) -> dict[str, float]:
        row: dict[str, float] = {"time": time.time()}
        if self.handle is not None:
            gpu = gpu_sample(self.handle)
            if "energy_joules" in gpu:
                self._energy_at_start = (
                    self._energy_at_start if self._energy_at_start is not None else gpu["energy_joules"]
                )
                gpu["energy_joules"] -= self._energy_at_start
            row |= {f"gpu_{self.rank}_{k}": v for k, v in gpu.items()}
        if self._host is not None:
            row |= self._host.sample()
        return row

    def _run(self) -> None:
        with open(self.path, "w", encoding="utf-8") as out:
            # One sample each interval (CPU utilisation is over the interval) and a last one at the end.
            while True:
                stopped = self._stop.wait(self.interval_s)
                try:
                    out.write(json.dumps(self.sample()) + "\n")
                    out.flush()
                except (OSError, pynvml.NVMLError, psutil.Error):
                    pass  # a sample lost (a full disk, a GPU fallen off the bus) must not end the run
                if stopped:
                    return

    def __enter__(self) -> SystemSampler:
        if self.host:
            self._host = HostSampler()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval_s))


def read_samples(path: Path) -> list[dict[str, float]]:
    """The rows of a system_metrics.jsonl; a line cut short (the worker killed as it wrote) is left out."""
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _series(rows: Iterable[dict[str, float]], name: str) -> Iterator[tuple[float, float]]:
    return ((r["time"], r[name]) for r in rows if name in r and math.isfinite(r[name]))


def summarise(rows: list[dict[str, float]], steady: tuple[float, float] | None = None) -> dict[str, float]:
    """`NAME_mean` and `NAME_peak` of every sampled name (energy: its last reading, the total). The
    peak is the whole run's; the mean is the steady steps' where `steady` (start, end) holds samples:
    a whole run's mean utilisation is mostly imports and compilation."""
    names = sorted({k for r in rows for k in r if k != "time"})
    out: dict[str, float] = {}
    for name in names:
        series = list(_series(rows, name))
        if not series:
            continue
        values = [v for _, v in series]
        if name.endswith("energy_joules"):
            out[name] = values[-1]
            continue
        measured = _steady_values(series, steady)
        out[f"{name}_mean"] = sum(measured) / len(measured)
        out[f"{name}_peak"] = max(values)
    return out


def _steady_values(series: list[tuple[float, float]], steady: tuple[float, float] | None) -> list[float]:
    """The values of `series` sampled in the steady steps (start, end), or all of them where none was."""
    in_steady = [v for t, v in series if steady is not None and steady[0] <= t <= steady[1]]
    return in_steady or [v for _, v in series]


def steady_peak(rows: list[dict[str, float]], name: str, steady: tuple[float, float] | None) -> float | None:
    """The most `name` read in the steady steps (start, end), or in the whole run where they hold no
    sample; None where it was never read. A process beside the worker's start or compile (the sweep's
    compile-ahead workers) leaves its measured steps alone."""
    values = _steady_values(list(_series(rows, name)), steady)
    return max(values) if values else None


def mean_power_w(rows: list[dict[str, float]], rank: int, start: float, end: float) -> tuple[float, str] | None:
    """The mean power of rank `rank`'s GPU over [start, end] and how it was measured: the energy
    counter's increase over the window (where the GPU has one and two readings fall in it), else the
    mean of the power samples in it. None without enough samples in the window."""
    energy = [(t, v) for t, v in _series(rows, f"gpu_{rank}_energy_joules") if start <= t <= end]
    if len(energy) >= 2 and energy[-1][0] > energy[0][0]:
        return (energy[-1][1] - energy[0][1]) / (energy[-1][0] - energy[0][0]), "nvml_energy_counter"
    power = [v for t, v in _series(rows, f"gpu_{rank}_power_usage_watts") if start <= t <= end]
    if power:
        return sum(power) / len(power), "power_samples"
    return None


def sampler_for(run_dir: Path, config: ConfigSchema, plan: RunPlan) -> SystemSampler | None:
    """The sampler of this rank (None with system_metrics.interval_s null): its own GPU (LOCAL_RANK
    among those visible, as the backends pick it), and the host on rank 0."""
    interval_s = config.system_metrics.interval_s
    if interval_s is None:
        return None
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    visible = len(visible_gpu_handles()) if plan.device.startswith("cuda") else 0
    gpu_index = local_rank % visible if visible else (0 if plan.device.startswith("cuda") else None)
    return SystemSampler(run_dir / rank_file(SYSTEM_METRICS, rank), interval_s, gpu_index, rank, host=rank == 0)


def system_summary(sampler: SystemSampler, metrics: dict[str, float], timing: dict[str, float]) -> tuple[dict, dict]:
    """(metrics, info) rank 0 adds to its summary: `NAME_mean` and `NAME_peak` of its samples, and
    the energy of the steady steps: the mean power of its GPU over them (`gpu_power_w`), joules per
    step and tokens per joule, counting every GPU of the run as drawing what rank 0's does."""
    rows = read_samples(sampler.path)
    start, end = timing.get("steady_from"), timing.get("steady_to")
    steady = (start, end) if start is not None and end is not None else None
    added = summarise(rows, steady)
    busy = contention(added, steady_peak(rows, f"gpu_{sampler.rank}_other_processes", steady), sampler.rank)
    if sampler.gpu_unseen:
        info = {"system_metrics": "host only: NVML cannot see this run's GPU (no NVIDIA driver library?)"}
    elif sampler.handle is None:
        info = {"system_metrics": "host only (no GPU)"}
    else:
        info = {"system_metrics": "gpu and host"}
    if busy:
        info["contended"] = busy  # the job tags the run with its info: ghsweep.contended (core.names.CONTENDED_TAG)
    if sampler.handle is None:
        return added, info
    power = mean_power_w(rows, sampler.rank, start, end) if start is not None and end is not None else None
    if power is None or power[0] <= 0 or start is None or end is None:
        info["energy_measured_by"] = "none: too few samples in the steady steps (lower system_metrics.interval_s)"
        return added, info
    watts, info["energy_measured_by"] = power
    gpus = metrics.get("world_size", 1)
    added |= {
        "gpu_power_w": watts,
        "energy_j_per_step": watts * gpus * metrics["step_time_ms"] / 1000,
        "steady_energy_j": watts * gpus * (end - start),
        "tokens_per_joule": metrics["tokens_per_s"] / (watts * gpus),
    }
    return added, info


def system_points(run_dir: Path) -> list[tuple[str, float, int, int]]:
    """Every rank's samples as MLflow's system-metrics monitor logs them: (`system/NAME`, value,
    sample number, timestamp in ms)."""
    points = []
    stem, _, suffix = SYSTEM_METRICS.partition(".")
    for path in sorted(run_dir.glob(f"{stem}*.{suffix}")):  # system_metrics.jsonl, system_metrics.rank1.jsonl, ...
        for step, row in enumerate(read_samples(path)):
            stamp = int(row["time"] * 1000)
            points += [(f"system/{k}", v, step, stamp) for k, v in row.items() if k != "time" and math.isfinite(v)]
    return points
