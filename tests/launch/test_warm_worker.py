"""Workers forked from the pre-imported worker (worker.preimported, the local launcher): each trains as a
worker started from its command does, in its own process group, with the run's environment, its
output in worker.log; a server that is gone leaves the runs to their commands, and a sweep says which
way each worker started."""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra.types import RunMode

from ghsweep.capture import nsys_session
from ghsweep.core.atomic import wait_for_file, write_atomic
from ghsweep.core.run_dir import (
    CAPTURE_ARMED,
    CAPTURE_MAY_EXIT,
    CAPTURE_STOPPING,
    METRICS,
    NSYS_REPORT,
    PROFILE_ANALYSIS,
    RESULT,
    SUMMARY,
    TORCH_TRACE,
    WORKER_ERROR,
    WORKER_LOG,
    WORKER_PID,
)
from ghsweep.core.run_plan import RunPlan, SessionCapture
from ghsweep.launch import warm_worker_client
from ghsweep.launch.local_gpus import ONE_AT_A_TIME_LAUNCHER
from ghsweep.launch.provenance import CODE_ENV, hand_code_version_to_jobs
from ghsweep.launch.run_planner import node_plan
from ghsweep.launch.warm_worker_client import (
    ForkedWorker,
    PreimportedWorkerCallback,
    WarmWorker,
    start_warm_worker,
    stop_warm_worker,
    worker_env,
)
from ghsweep.launch.worker_process import WorkerExit, process_start, run_worker, stop_orphaned_worker, worker_pid
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.planned_run import planned_run
from tests.support.processes import live_group_members
from tests.support.stand_ins import NODE_GPU, fake_nsys

# Every test forks or starts workers through ghsweep's launcher (tests/support/tiers.py cannot see it).
pytestmark = pytest.mark.cli

FORKED = "forked from the pre-imported worker"


@pytest.fixture
def warm() -> Iterator[Callable[[], WarmWorker]]:
    """This process's pre-imported worker, started in the test's own environment (pytest changes
    PYTEST_CURRENT_TEST between a fixture and its test, which would start it again)."""

    def start() -> WarmWorker:
        start_warm_worker()
        assert warm_worker_client._warm is not None
        return warm_worker_client._warm

    yield start
    stop_warm_worker()


def worker_of(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "ghsweep.train.worker", str(run_dir)]


def tiny_run(run_dir: Path, *overrides: str, profiler: str = "none") -> Path:
    cfg = compose_config("experiment=smoke", "train.max_steps=2", "train.seq_length=64", *overrides)
    planned_run(run_dir, cfg, profiler)
    return run_dir


def test_a_forked_worker_trains_in_its_own_process_group_and_writes_its_log(warm, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")
    warm()
    runs = [tiny_run(tmp_path / str(n)) for n in range(2)]
    for run_dir in runs:
        exit = run_worker(worker_of(run_dir), run_dir, timeout_s=600, preimported=True)
        assert exit.returncode == 0, (run_dir / WORKER_LOG).read_text()[-3000:]
        assert json.loads((run_dir / SUMMARY).read_text())["metrics"]["steps"] == 2
        assert "step 2/2" in (run_dir / WORKER_LOG).read_text()
        assert live_group_members(worker_pid(run_dir)) == []
    assert caplog.text.count(FORKED) == 2  # both from the one server, its imports made once
    # The first says how long the imports took and how long it waited for them, in the sweep's log.
    assert caplog.text.count("the pre-imported worker was ready") == 1
    ready = re.search(
        r"was ready ([\d.]+) s after it started \(its imports\); this combination waited ([\d.]+) s", caplog.text
    )
    assert ready and 0 < float(ready[1]) and 0 <= float(ready[2]) <= float(ready[1]), caplog.text


def test_a_forked_worker_has_the_runs_environment(warm, tmp_path, caplog):
    # Set after the server started: what is read at import must be the run's, so it starts again.
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")
    warm()
    run_dir = tiny_run(tmp_path)
    exit = run_worker(worker_of(run_dir), run_dir, 600, env={"CUDA_VISIBLE_DEVICES": "7"}, preimported=True)
    assert exit.returncode == 0, (run_dir / WORKER_LOG).read_text()[-3000:]
    assert json.loads((run_dir / SUMMARY).read_text())["info"]["cuda_visible_devices"] == "7"
    assert "environment changed (CUDA_VISIBLE_DEVICES)" in caplog.text and FORKED in caplog.text


def test_a_failing_and_a_hanging_forked_worker_end_as_started_ones_do(warm, tmp_path):
    warm()
    broken = tmp_path / "broken"
    broken.mkdir()  # no config or plan: the worker fails and says why
    exit = run_worker(worker_of(broken), broken, timeout_s=600, preimported=True)
    assert exit.returncode == 1 and json.loads((broken / WORKER_ERROR).read_text())["type"] == "FileNotFoundError"
    hanging = tiny_run(tmp_path / "hanging", "train.max_steps=100000")
    exit = run_worker(worker_of(hanging), hanging, timeout_s=15, preimported=True)
    assert exit.timed_out and exit.returncode == -signal.SIGKILL
    assert live_group_members(worker_pid(hanging)) == []


def test_without_its_server_a_run_starts_from_its_command(warm, tmp_path, caplog):
    # As when the server is killed (the out-of-memory killer): the sweep goes on without it.
    server = warm()._process
    server.kill()
    server.wait()
    run_dir = tiny_run(tmp_path)
    exit = run_worker(worker_of(run_dir), run_dir, timeout_s=600, preimported=True)
    assert exit.returncode == 0, (run_dir / WORKER_LOG).read_text()[-3000:]
    assert "the pre-imported worker is unavailable (the pre-imported worker exited" in caplog.text
    assert FORKED not in caplog.text
    assert warm_worker_client._warm is None


def test_an_orphaned_worker_is_stopped_only_while_its_pid_is_that_process(tmp_path):
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (tmp_path / WORKER_PID).write_text(f"{sleeper.pid}\n{int(process_start(sleeper.pid)) + 1}\n")
        assert not stop_orphaned_worker(tmp_path)  # the pid now names another process
        assert sleeper.poll() is None
        (tmp_path / WORKER_PID).write_text(f"{sleeper.pid}\n{process_start(sleeper.pid)}\n")
        assert stop_orphaned_worker(tmp_path)
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
    finally:
        sleeper.kill()


def test_a_local_sweep_forks_its_workers_unless_told_not_to(tmp_path):
    line = ["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2,3", "train.seq_length=64"]
    forked = run_cli([*line, "hydra.sweep.dir=forked"], tmp_path)
    assert forked.returncode == 0, forked.stderr[-3000:]
    assert forked.stdout.count(FORKED) + forked.stderr.count(FORKED) == 2
    started = run_cli([*line, "worker.preimported=false", "hydra.sweep.dir=started"], tmp_path)
    assert started.returncode == 0, started.stderr[-3000:]
    assert FORKED not in started.stdout + started.stderr
    assert "2 of 2 runs finished" in started.stdout and "2 of 2 runs finished" in forked.stdout


@pytest.mark.parametrize(
    ("mode", "launcher", "preimported", "dry_run", "serves"),
    [
        (RunMode.MULTIRUN, ONE_AT_A_TIME_LAUNCHER, True, False, True),
        (RunMode.RUN, ONE_AT_A_TIME_LAUNCHER, True, False, False),  # one run: nothing to amortise
        (RunMode.MULTIRUN, "hydra_plugins.ghsweep_launcher.ghsweep_launcher.SlurmLauncher", True, False, False),
        (RunMode.MULTIRUN, ONE_AT_A_TIME_LAUNCHER, False, False, False),
        (RunMode.MULTIRUN, ONE_AT_A_TIME_LAUNCHER, True, True, False),  # a dry run starts no worker
    ],
)
def test_the_server_starts_as_hydra_makes_the_callbacks_for_a_sweep_run_here(
    mode, launcher, preimported, dry_run, serves, monkeypatch
):
    # As in a sweep's own process before it starts (set first, so that it is unset again after the test).
    monkeypatch.setenv(CODE_ENV, "")
    monkeypatch.delenv(CODE_ENV)
    try:
        callback = PreimportedWorkerCallback(mode, launcher, preimported, dry_run)
        assert (warm_worker_client._warm is not None) == serves
        if serves:
            # The sweep hands its code identity to its jobs as it starts: the server must already have
            # the jobs' environment, or the first job would start a second one and wait for its imports.
            hand_code_version_to_jobs()
            assert warm_worker_client._warm.env == worker_env()
        callback.on_multirun_end(config=None)
        assert warm_worker_client._warm is None
    finally:
        stop_warm_worker()


def test_a_server_still_importing_is_killed_when_the_sweep_stops_before_its_first_run():
    # A sweep refused by its check stops the server it started: it must not wait out the imports.
    server = WarmWorker(worker_env())
    server.close()
    assert server._process.returncode == -signal.SIGKILL


@pytest.mark.gpu
def test_a_run_on_the_gpu_is_forked_and_sets_cuda_up_itself(warm, tmp_path, caplog):
    """The server's imports leave CUDA alone on a GPU machine (torchao's import-time questions about
    the GPU are answered from NVML), so the worker is forked and initialises CUDA in its own process."""
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")
    warm()
    run_dir = tiny_run(tmp_path, "device=cuda")
    exit = run_worker(worker_of(run_dir), run_dir, timeout_s=600, preimported=True)
    assert exit.returncode == 0, caplog.text + (run_dir / WORKER_LOG).read_text()[-3000:]
    assert FORKED in caplog.text, caplog.text
    summary = json.loads((run_dir / SUMMARY).read_text())
    assert summary["metrics"]["steps"] >= 2 and summary["info"]["device"] == "cuda", summary["info"]


def test_under_nsys_each_forked_worker_is_one_collection_of_the_servers_session(warm, tmp_path, caplog):
    """The server runs under `nsys launch` in a session of its own, each worker is forked between
    that session's `nsys start` and `nsys stop` and has what nsys's launch added to the environment;
    a collection nsys refuses leaves the runs to their commands (`nsys profile` in a sweep)."""
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")
    warm()  # as the sweep started it, without a profiler: the first recorded run starts it again
    nsys = str(fake_nsys(tmp_path / "tools"))
    capture = SessionCapture([nsys, "launch", "--trace=cuda,nvtx"], [nsys, "start", "--output=profile"], handoff=True)
    runs = [tiny_run(tmp_path / str(n)) for n in range(2)]
    for run_dir in runs:
        exit = run_worker(worker_of(run_dir), run_dir, timeout_s=600, preimported=True, capture=capture)
        assert exit.returncode == 0, (run_dir / WORKER_LOG).read_text()[-3000:]
        assert json.loads((run_dir / SUMMARY).read_text())["info"]["cuda_visible_devices"] == "5"
    assert caplog.text.count(FORKED) == 2 and "profiler changed (an nsys session)" in caplog.text
    session = (tmp_path / "tools" / "session").read_text().strip()
    calls = (tmp_path / "tools" / "calls").read_text().splitlines()
    assert calls[0].startswith(f"launch --trace=cuda,nvtx --session-new={session} {sys.executable} -m ghsweep.train.")
    per_run = [c for c in calls[1:] if not c.startswith("sessions")]
    assert per_run == [f"start --output=profile --session={session}", f"stop --session={session}"] * 2

    (tmp_path / "tools" / "start.fails").write_text("Collection start is not allowed in this state.\n")
    run_dir = tiny_run(tmp_path / "refused")
    exit = run_worker(worker_of(run_dir), run_dir, timeout_s=600, preimported=True, capture=capture)
    assert exit.returncode == 0, (run_dir / WORKER_LOG).read_text()[-3000:]
    assert "unavailable (nsys start failed: Collection start is not allowed in this state.)" in caplog.text
    assert caplog.text.count(FORKED) == 2 and warm_worker_client._warm is None


def test_a_handed_collection_lets_the_next_worker_start_while_nsys_writes_the_last_report(
    warm, tmp_path, caplog, monkeypatch, request
):
    """With the collection handed to the worker (ghsweep.core.handoff), a worker exits once nsys holds
    its report, the next is forked at once and trains while that report is written, and its own
    collection is armed only once the session is free: before its capture window, which waits for it.
    No `nsys stop` is needed for a worker that handed its collection back; one that failed first has
    its collection ended by the sweep. The worker's side runs for real (its capture window here is the
    PyTorch profiler's, on the CPU); the stand-in nsys's state is set by the test as nsys's would go."""
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")
    monkeypatch.setattr(nsys_session, "REPORT_TIMEOUT_S", 60)  # a wrong wait fails the test, not CI's clock
    warm()
    tools = tmp_path / "tools"
    nsys = str(fake_nsys(tools))
    capture = SessionCapture([nsys, "launch", "--trace=cuda,nvtx"], [nsys, "start", "--output=profile"], handoff=True)
    runs = [tiny_run(tmp_path / str(n), "train.max_steps=4", "capture.num_steps=2", profiler="torch") for n in range(2)]
    write_atomic(tools / "state", "RangeImportation")  # nsys holds each stopped capture, writing its report
    # Whatever the test finds, the server's close (the fixture's) finds the reports written.
    request.addfinalizer(lambda: write_atomic(tools / "state", "Launched"))

    exit = run_worker(worker_of(runs[0]), runs[0], timeout_s=600, preimported=True, capture=capture)
    assert exit.returncode == 0, (runs[0] / WORKER_LOG).read_text()[-3000:]
    assert {p.name for p in runs[0].iterdir()} >= {CAPTURE_ARMED, CAPTURE_STOPPING, CAPTURE_MAY_EXIT}
    # The sweep's follow-up of the first run waits for its report, as the second run starts.
    analysis = threading.Thread(target=warm_worker_client.wait_for_report, args=(runs[0],))
    analysis.start()
    second: list[WorkerExit] = []
    trains = threading.Thread(
        target=lambda: second.append(
            run_worker(worker_of(runs[1]), runs[1], timeout_s=600, preimported=True, capture=capture)
        )
    )
    trains.start()
    # The second worker is forked and trains while the first report is being written; its collection waits.
    assert wait_for_file(runs[1] / METRICS, 120) is not None, (runs[1] / WORKER_LOG).read_text()[-3000:]
    assert not (runs[1] / CAPTURE_ARMED).exists() and trains.is_alive()
    session = (tools / "session").read_text().strip()
    per_run = [c for c in (tools / "calls").read_text().splitlines()[1:] if not c.startswith("sessions")]
    assert per_run == [f"start --output=profile --session={session}"]
    assert analysis.is_alive()
    write_atomic(tools / "state", "Launched")  # the first report is written
    trains.join(120)
    analysis.join(60)
    assert not analysis.is_alive()
    assert second and second[0].returncode == 0, (runs[1] / WORKER_LOG).read_text()[-3000:]
    warm_worker_client.wait_for_report(runs[1])
    per_run = [c for c in (tools / "calls").read_text().splitlines()[1:] if not c.startswith("sessions")]
    assert per_run == [f"start --output=profile --session={session}"] * 2
    assert caplog.text.count(FORKED) == 2
    for run_dir in runs:  # each recorded its capture window
        assert (run_dir / TORCH_TRACE).exists(), sorted(p.name for p in run_dir.iterdir())

    broken = tmp_path / "broken"
    broken.mkdir()  # no config or plan: the worker fails before its capture
    exit = run_worker(worker_of(broken), broken, timeout_s=600, preimported=True, capture=capture)
    assert exit.returncode == 1
    per_run = [c for c in (tools / "calls").read_text().splitlines()[1:] if not c.startswith("sessions")]
    assert per_run[2:] == [f"start --output=profile --session={session}", f"stop --session={session}"]


def test_what_a_handed_worker_left_running_is_killed_only_once_its_report_is_written(tmp_path, caplog):
    """A worker that handed its collection over and left processes running (a process of the
    user's) is settled before the job kills its group: the kill waits for
    nsys's report, as a kill while nsys writes holds it for about 30 s; a group that ends by itself
    first is not waited for. Real processes; the hand-off's events set as nsys's writing would."""
    caplog.set_level(logging.INFO, logger="ghsweep.launch.warm_worker_client")

    def handed_worker(pid: int) -> tuple[ForkedWorker, nsys_session.CollectionHandoff]:
        watch = nsys_session.CollectionHandoff("nsys", "session", ["nsys", "start"], tmp_path, None, armed=True)
        watch.handed.set()
        return ForkedWorker(pid, server=None, recorded=True, handoff=watch), watch  # type: ignore[arg-type]

    left_running = subprocess.Popen(["sleep", "60"], start_new_session=True)
    worker, watch = handed_worker(left_running.pid)
    settling = threading.Thread(target=worker.wait_for_report_before_kill)
    settling.start()
    settling.join(1.0)
    assert settling.is_alive() and left_running.poll() is None  # nsys is still writing: nothing is killed
    watch.written.set()
    settling.join(10)
    assert not settling.is_alive() and "nsys had written its report" in caplog.text
    left_running.kill()
    left_running.wait()

    ends_itself = subprocess.Popen(["sleep", "0.5"], start_new_session=True)
    worker, watch = handed_worker(ends_itself.pid)
    settling = threading.Thread(target=worker.wait_for_report_before_kill)
    settling.start()
    ends_itself.wait()
    settling.join(10)
    assert not settling.is_alive() and not watch.written.is_set() and "they had ended" in caplog.text

    # Nothing left running: no wait at all, whatever nsys is doing.
    caplog.clear()
    worker, _ = handed_worker(ends_itself.pid)
    worker.wait_for_report_before_kill()
    assert "left processes running" not in caplog.text


def test_a_run_under_nsys_is_planned_to_fork_in_a_session_unless_only_nsys_profile_takes_its_options(tmp_path):
    nsys = str(fake_nsys(tmp_path / "tools"))
    cfg = compose_config("profile=nsys", f"profile.nsys.path={nsys}")
    plan, _ = node_plan(cfg, tmp_path / "run", "run", [], NODE_GPU, slurm_tasks=None)
    assert plan.worker_command[:2] == [nsys, "profile"]  # a worker started from its command
    assert plan.preimported and plan.capture is not None
    assert plan.capture.launch[:2] == [nsys, "launch"] and plan.capture.start[:2] == [nsys, "start"]
    # The collection is handed to the worker by default, unless asked otherwise.
    assert plan.capture.handoff
    waits = compose_config("profile=nsys", f"profile.nsys.path={nsys}", "profile.nsys.handoff=false")
    plan, _ = node_plan(waits, tmp_path / "run", "run", [], NODE_GPU, slurm_tasks=None)
    assert plan.capture is not None and not plan.capture.handoff
    (tmp_path / "run").mkdir()
    plan.save(tmp_path / "run")
    assert RunPlan.load(tmp_path / "run") == plan  # as the worker and the dry run read it
    odd = compose_config("profile=nsys", f"profile.nsys.path={nsys}", "profile.nsys.extra_args=['-s','none']")
    plan, _ = node_plan(odd, tmp_path / "odd", "odd", [], NODE_GPU, slurm_tasks=None)
    assert not plan.preimported and plan.capture is None and plan.worker_command[:2] == [nsys, "profile"]


@pytest.mark.gpu
@pytest.mark.skipif(not shutil.which("nsys"), reason="needs nsys on PATH (Nsight Systems)")
@pytest.mark.parametrize(("start_step", "window"), [("4", {4, 5, 6, 7}), ("auto", {8, 9, 10, 11})])
def test_a_sweep_under_nsys_forks_each_worker_into_a_session_that_records_only_its_capture(
    tmp_path, start_step, window
):
    """Real nsys: the server runs in an nsys session, and each run's report holds its own capture
    window (capture.num_steps steps of its own worker: from step 4, or the run's last 4 of 12),
    analysed as a report of `nsys profile` is. Each collection is handed to its worker
    (ghsweep.core.handoff): a window that ends the run stops without waiting for the report, and the
    next worker starts while it is written; a window with steps after it waits for it in the loop."""
    line = ["-m", "device=cuda", "profile=nsys", "train.compile=false"]
    line += ["train.measure=false", "train.max_steps=12"]
    line += [f"capture.start_step={start_step}", "capture.num_steps=4", "train.micro_batch_size=1,2,4"]
    line += ["hydra.sweep.dir=sweep"]
    proc = run_cli(line, tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count(FORKED) == 3, proc.stdout + proc.stderr
    run_dirs = sorted(p.parent for p in (tmp_path / "sweep").glob("*/" + RESULT))
    assert len(run_dirs) == 3
    for run_dir in run_dirs:
        assert (run_dir / NSYS_REPORT).exists(), sorted(p.name for p in run_dir.iterdir())
        assert (run_dir / CAPTURE_MAY_EXIT).exists(), sorted(p.name for p in run_dir.iterdir())
        analysis = json.loads((run_dir / PROFILE_ANALYSIS).read_text())
        steps = analysis["window"]["steps"]  # the NVTX-ranged steps the report holds, less warm-up
        held = steps + analysis["window"]["warmup_steps"]  # warm-up: at least the step the capture began in
        assert analysis["source"]["kind"] == "nsys" and steps and set(held) <= window, analysis["window"]
        # Whole: a worker that exits before nsys holds its capture leaves a report of a few kernels.
        assert len(held) >= 3 and len(steps) >= 2 and analysis["top_kernels"], analysis["window"]
        timing = json.loads((run_dir / RESULT).read_text())["timing"]
        assert 0 < timing["capture_s"] < timing["train_s"], timing
