"""Command lines that put a worker under Nsight Systems or Nsight Compute, and where the tools are
(what turns their reports into files the analysis reads: ghsweep.profile.nsight_exports).

Every command is an argument list (never a shell string). The capture range is the CUDA profiler
API: the worker calls cudaProfilerStart/Stop around `capture.start_step`..+`capture.num_steps`
(ghsweep/train/phases.py), so nsys and ncu record exactly those steps.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def find_tool(name: str, configured: str | None) -> str | None:
    """The configured path when it is an executable file, else `name` on PATH, else None."""
    if configured:
        path = Path(configured)
        return str(path) if path.is_file() and shutil.which(str(path)) else None
    return shutil.which(name)


# What the extra arguments of a capture (profile.nsys.extra_args, as --NAME=VALUE) may name when the
# capture is split between `nsys launch` (how a program is traced) and `nsys start` (what one
# collection records): the options each takes, from nsys 2025.3's `--help` of each, less those ghsweep
# sets itself (the trace set, the capture range, the report, the session).
NSYS_LAUNCH_OPTIONS = frozenset(
    {
        "--cuda-event-trace",
        "--cuda-flush-interval",
        "--cuda-graph-trace",
        "--cuda-memory-usage",
        "--cuda-trace-all-apis",
        "--cudabacktrace",
        "--dask",
        "--env-var",
        "--mpi-impl",
        "--nvtx-capture",
        "--nvtx-domain-exclude",
        "--nvtx-domain-include",
        "--opengl-gpu-workload",
        "--osrt-backtrace-stack-size",
        "--osrt-backtrace-threshold",
        "--osrt-threshold",
        "--python-backtrace",
        "--python-functions-trace",
        "--python-sampling",
        "--python-sampling-frequency",
        "--pytorch",
        "--resolve-symbols",
        "--vulkan-gpu-workload",
    }
)
NSYS_START_OPTIONS = frozenset(
    {
        "--backtrace",
        "--cpu-core-events",
        "--cpuctxsw",
        "--debug-symbols",
        "--event-sample",
        "--event-sampling-interval",
        "--export",
        "--flush-on-cudaprofilerstop",
        "--ftrace",
        "--ftrace-keep-user-config",
        "--gpu-metrics-frequency",
        "--gpu-metrics-set",
        "--gpu-video-device",
        "--gpuctxsw",
        "--ib-net-info-devices",
        "--ib-net-info-files",
        "--ib-net-info-output",
        "--nic-metrics",
        "--os-events",
        "--sample",
        "--samples-per-backtrace",
        "--sampling-period",
        "--stats",
    }
)


@dataclass(frozen=True)
class NsysCapture:
    """An Nsight Systems capture of a worker's capture range (the CUDA profiler API's: the worker's
    capture steps) to `report`, said as one `nsys profile` around a worker started from its command,
    or split between the `nsys launch` of a program that forks the worker and the `nsys start` of
    one collection of its session."""

    nsys: str
    report: Path
    trace: Sequence[str]
    um_page_faults: bool
    extra_args: Sequence[str]
    gpu_metrics: bool = False

    def options(self) -> tuple[list[str], list[str]]:
        """ghsweep's own options: (how the program is traced, what the collection records)."""
        tracing = [f"--trace={','.join(self.trace)}"]
        if self.um_page_faults:
            tracing += ["--cuda-um-cpu-page-faults=true", "--cuda-um-gpu-page-faults=true"]
        collection = [
            "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop",
            "--force-overwrite=true",
            f"--output={self.report.with_suffix('')}",
        ]
        if self.gpu_metrics:
            # The run's own GPUs only: sampling is one profiler per GPU, and other jobs may share the node.
            collection += ["--gpu-metrics-devices=cuda-visible"]
        return tracing, collection

    def profile_command(self) -> list[str]:
        """`nsys profile ...` up to (not including) the profiled program's own argv."""
        tracing, collection = self.options()
        return [self.nsys, "profile", *tracing, *collection, *self.extra_args]

    def session_commands(self) -> tuple[list[str], list[str]] | None:
        """(`nsys launch ...` that runs the forking program, tracing its children from their fork on,
        `nsys start ...` that records one child's capture range), each up to its `--session` option;
        None when an extra argument is not an option of either (or not written --NAME=VALUE)."""
        tracing, collection = self.options()
        launch = [self.nsys, "launch", *tracing, "--trace-fork-before-exec=true"]
        start = [self.nsys, "start", *collection]
        for arg in self.extra_args:
            name = arg.split("=", 1)[0] if "=" in arg else None
            if name in NSYS_LAUNCH_OPTIONS:
                launch.append(arg)
            elif name in NSYS_START_OPTIONS:
                start.append(arg)
            else:
                return None
        return launch, start


def kernel_name_regex(names: Sequence[str]) -> str:
    """An ncu `--kernel-name regex:` that matches exactly these function names."""
    return "regex:^(" + "|".join(re.escape(n) for n in names) + ")$"


def ncu_command(
    ncu: str,
    report: Path,
    kernel_names: Sequence[str],
    launch_count: int,
    section_set: str,
    metrics: Sequence[str] = (),
    per_launch_config: bool = False,
) -> list[str]:
    """`ncu ...` for the named kernels (all kernels when none are named) inside the capture window,
    up to the program's own argv. `per_launch_config`: `launch_count` launches of each launch
    configuration (kernel, grid, block, shared memory) instead of `launch_count` in all, so every
    named kernel is profiled a few times and none is profiled at every launch of a step.

    `--clock-control none` keeps the GPU's own clocks (ncu otherwise locks them to base clock,
    which changes what is measured and is not allowed on shared machines).
    """
    command = [
        ncu,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--launch-count",
        str(launch_count),
        "--set",
        section_set,
        "--export",
        str(report.with_suffix("")),
        "--force-overwrite",
    ]
    if per_launch_config:
        command += ["--filter-mode", "per-launch-config"]
    if kernel_names:
        command += ["--kernel-name-base", "function", "--kernel-name", kernel_name_regex(kernel_names)]
    if metrics:
        command += ["--metrics", ",".join(metrics)]
    return command
