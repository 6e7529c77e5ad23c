"""The job's side of the worker process: its output copied to worker.log, and the run over when the
worker is, whatever the worker left running."""

from __future__ import annotations

import pytest

from ghsweep.core.run_dir import WORKER_LOG
from ghsweep.launch.worker_process import run_worker, worker_pid
from tests.support.processes import live_group_members

# ghsweep's run_worker starts the worker, a process (tests/support/tiers.py cannot see it).
pytestmark = pytest.mark.cli


def test_a_process_the_worker_leaves_on_its_pipe_does_not_hold_the_run(tmp_path):
    # As Inductor's compile pool does when a short run ends while the pool is still starting.
    leftover = "sleep 300 & echo trained; exit 3"
    exit = run_worker(["bash", "-c", leftover], tmp_path, timeout_s=600)
    assert exit.returncode == 3
    assert not exit.timed_out
    assert exit.wall_s < 60, f"run_worker waited {exit.wall_s:.0f} s for the worker's leftover process"
    assert live_group_members(worker_pid(tmp_path)) == []
    assert (tmp_path / WORKER_LOG).read_text() == "trained\n"
