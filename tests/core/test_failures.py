"""The class of a failure, from the one-line error and the worker log's end: what is run again."""

from __future__ import annotations

import pytest

from ghsweep.core.failures import DETERMINISTIC, INFRASTRUCTURE, failure_class, out_of_memory


@pytest.mark.parametrize(
    "error, log_tail",
    [
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", ""),
        ("torch.OutOfMemoryError: CUDA out of memory", ""),
        ("FloatingPointError: loss became nan at step 7", ""),
        ("FloatingPointError: loss became inf at step 3", ""),
        ("precision=fp8: needs an NVIDIA GPU of compute capability >= 8.9", ""),
        ("ValueError: train.micro_batch_size=2: the data packs into 1 block(s)", "Traceback ...\nValueError: ..."),
        ("worker exited with status 3: segfault in a kernel", ""),
        ("worker killed by SIGSEGV", ""),
        ("worker killed by SIGABRT", ""),
        ("worker timed out after 30 min (worker.timeout_min) and was killed", ""),
        # Its OOM took the other ranks down with an NCCL abort: the combination's fault all the same.
        ("rank 1: OutOfMemoryError: CUDA out of memory", "ProcessGroupNCCL: communicator aborted"),
    ],
)
def test_the_combinations_own_failures_are_deterministic(error, log_tail):
    assert failure_class(error, log_tail) == DETERMINISTIC


@pytest.mark.parametrize(
    "error, log_tail",
    [
        ("worker killed by SIGKILL (killed from outside, often the out-of-memory killer)", ""),
        ("worker killed by SIGTERM", ""),
        ("worker exited with status 1: RuntimeError: NCCL communicator was aborted on rank 0", ""),
        (
            "worker exited with status 1: torch.distributed.DistBackendError: ...",
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 ms",
        ),
        ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", ""),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", ""),
        ("worker exited with status 1: ...", "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus."),
        ("SLURM job 123 ended NODE_FAIL: job 123 has not produced any output", ""),
        ("SLURM job 123 ended PREEMPTED", ""),
    ],
)
def test_the_machines_failures_are_infrastructure(error, log_tail):
    assert failure_class(error, log_tail) == INFRASTRUCTURE


@pytest.mark.parametrize(
    "error, expected",
    [
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("rank 1: torch.OutOfMemoryError: CUDA out of memory", True),
        ("worker killed by SIGKILL (killed from outside, often the out-of-memory killer)", False),
        ("FloatingPointError: loss became nan at step 7", False),
    ],
)
def test_out_of_gpu_memory_is_told_from_the_hosts_and_other_failures(error, expected):
    assert out_of_memory(error) is expected
