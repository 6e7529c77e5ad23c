"""The GPU half of the busy-machine check on a real GPU: NVML's view of who else uses the run's GPU
and whether its clocks are held down, as the worker's sampler reads it.

Run on a GPU machine with `pytest -m gpu tests/train/test_system_metrics_gpu.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from ghsweep.core.gpu import visible_gpu_handles
from ghsweep.train.system_metrics import contention, gpu_sample

pytestmark = pytest.mark.gpu

# A process on GPU 0 that keeps it busy until its stdin closes: another user of the run's GPU.
OTHER_USER = """
import sys, threading, torch
x = torch.randn(2048, 2048, device="cuda")
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("ready", flush=True)
while not done.is_set():
    x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
"""

# The worker's side: a process with its own CUDA context on GPU 0 that prints one gpu_sample a line
# asked. Its own processes are itself and its children; the other user above is neither.
SAMPLER = """
import json, sys, torch
from ghsweep.core.gpu import visible_gpu_handles
from ghsweep.train.system_metrics import gpu_sample
torch.zeros(1, device="cuda")
handle = visible_gpu_handles()[0]
for _ in sys.stdin:
    print(json.dumps(gpu_sample(handle)), flush=True)
"""


def wait_until(read, want, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = read()
        if want(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def started(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_another_process_on_the_runs_gpu_is_counted_and_marks_the_run_contended():
    sampler = started(SAMPLER)
    assert sampler.stdin is not None and sampler.stdout is not None

    def sample() -> dict:
        sampler.stdin.write("\n")
        sampler.stdin.flush()
        return json.loads(sampler.stdout.readline())

    try:
        before = sample()
        if "other_processes" not in before:
            pytest.skip(
                "NVML does not list the sampler among the GPU's processes (it names them by the host's pids, "
                "which a container does not see): the sampler leaves other_processes out, as it should"
            )
        assert "clocks_slowed" in before, f"NVML gave no clock-slowdown reasons on this GPU: {before}"
        others = before["other_processes"]  # this test's own process may hold a context already
        other = started(OTHER_USER)
        try:
            assert other.stdout is not None and other.stdout.readline().strip() == "ready"
            shared = wait_until(sample, lambda s: s.get("other_processes", 0) > others)
        finally:
            other.communicate(input="", timeout=60)
        assert shared["other_processes"] == others + 1, shared
        after = wait_until(sample, lambda s: s.get("other_processes") == others)
        assert after["other_processes"] == others, after
    finally:
        sampler.communicate(input="", timeout=60)
    # The most such processes at once in the measured steps, as the summary reads them.
    assert "1 other process(es) on its GPU" in (contention({}, sharing=1.0) or "")


def test_a_gpu_under_load_at_a_normal_temperature_is_not_read_as_slowed():
    handle = visible_gpu_handles()[0]
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    samples = []
    for _ in range(10):
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        samples.append(gpu_sample(handle))
    with_reasons = [s for s in samples if "clocks_slowed" in s]
    assert with_reasons, f"NVML gave no clock-slowdown reasons on this GPU: {samples[-1]}"
    slowed_share = sum(s["clocks_slowed"] for s in with_reasons) / len(with_reasons)
    temperature = max(s.get("temperature_celsius", 0) for s in samples)
    # A power cap met under full load is not a slowdown; heat or a hardware brake is, and would be named.
    assert slowed_share < 0.1 or temperature >= 85, (slowed_share, temperature, samples[-1])
