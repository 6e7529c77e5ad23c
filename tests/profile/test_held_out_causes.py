"""The cause a finding names is the cause in the events: one planted trace per mistake seen on
profiles made by others (old Kineto layouts, DataLoader stalls, CUDA graphs behind a sync, stub
steps, blocking copies in nsys, alternating timesteps, mostly-CPU steps, one slow first launch,
the compute/transfer wording, damaged traces), each with its truth known by construction and,
where the issue names one, the same run's negative control."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from ghsweep.profile import nsys_db, profile_report
from ghsweep.profile.findings import balance_words, health
from ghsweep.profile.nsys_analysis import SYNC_CALLS
from ghsweep.profile.result import Finding, ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis
from tests.profile.planted import GEMM, MAIN_TID, MS, US, Run, training_run, write_nsys, write_torch

WRITERS = {
    "nsys": lambda run, d: write_nsys(run, d / "profile.sqlite"),
    "torch": lambda run, d: write_torch(run, d / "trace.json"),
}


def ids(a: ProfileAnalysis) -> list[str]:
    return [f.id for f in a.findings]


def by_id(a: ProfileAnalysis, id_: str) -> Finding:
    return next(f for f in a.findings if f.id == id_)


def call(run: Run, start: int, end: int, name: str) -> int:
    """A host API call of the main thread with its own correlation id."""
    run._corr += 1
    run.calls.append((start, end, name, run._corr))
    return run._corr


def idle_in_window(run: Run, window: dict) -> int:
    """The GPU's idle time inside the window, from the planted kernels and copies (the truth)."""
    spans = sorted([(max(s, window["start_ns"]), min(e, window["end_ns"])) for s, e, *_ in run.kernels + run.copies])
    busy, reach = 0, window["start_ns"]
    for s, e in spans:
        if e > reach:
            busy += e - max(s, reach)
            reach = e
    return window["duration_ns"] - busy


# 1. PyTorch <= 1.9 traces: categories Kernel, Runtime, Operator, Memcpy, Memset.
OLD_CATEGORY = {"kernel": "Kernel", "cuda_runtime": "Runtime", "user_annotation": "Operator", "gpu_memcpy": "Memcpy"}


def test_old_kineto_categories_are_read_as_today(tmp_path):
    run = training_run(lambda i: f"ProfilerStep#{i}")
    today = write_torch(run, tmp_path / "today.json")
    trace = json.loads(today.read_text())
    for event in trace["traceEvents"]:
        event["cat"] = OLD_CATEGORY[event["cat"]]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(trace))
    a, b = full_analysis(old), full_analysis(today)
    assert a.source["device"] == "cuda" and a.kernels["count"] == b.kernels["count"] > 0
    assert a.window == b.window and a.gpu_busy_pct == b.gpu_busy_pct and a.gaps == b.gaps
    out = subprocess.run([sys.executable, "-m", "ghsweep.analyze", str(old)], capture_output=True, text=True)
    assert out.returncode == 0 and "nothing to analyse" not in out.stderr


# 2. A DataLoader with num_workers=0 stalls every step ~48 ms inside PyTorch's own ranges.
def loader_run(iterator: str, load_ms: float, steps: int = 5) -> Run:
    run = Run()
    t = 0
    for i in range(steps):
        host0 = t
        run.ranges.append((f"enumerate(DataLoader)#{iterator}.__next__", t, t + int(load_ms * MS), MAIN_TID))
        t += int(load_ms * MS)
        gpu = t + 20 * US
        for j in range(10):  # 10 GEMMs of 2 ms, launched at once
            gpu = run.launch(t + j * 10 * US, max(gpu, t + j * 10 * US + 10 * US), 2 * MS, GEMM)
        t = gpu - 5 * MS  # the host moves on to the next batch before the GPU is done
        run.ranges.append((f"ProfilerStep#{i}", host0, t, MAIN_TID))
    return run


@pytest.mark.parametrize("reader", WRITERS)
def test_dataloader_ranges_are_data_loading_and_say_num_workers(tmp_path, reader):
    run = loader_run("_SingleProcessDataLoaderIter", 48)
    a = full_analysis(WRITERS[reader](run, tmp_path))
    truth_ms = idle_in_window(run, a.window) / len(a.window["steps"]) / 1e6
    found = by_id(a, "data_loading")
    assert found.evidence["data_loading_ms_per_step"] == pytest.approx(truth_ms, rel=1e-6)
    assert truth_ms > 30 and f"{truth_ms:.2f} ms per step" in found.message and "num_workers" in found.message
    assert "launch_bound" not in ids(a)
    # The gaps behind the number, with their times on the timeline: each ends where a GEMM starts.
    top = a.gaps["top_gaps"]["data_loading"]
    assert len(top) == len(a.window["steps"])  # a loading step is mostly CPU: the window covers its stall too
    assert {g["end_ns"] for g in top} <= {s for s, *_ in run.kernels}
    assert sum(g["ms"] for g in top) == pytest.approx(truth_ms * len(a.window["steps"]))


@pytest.mark.parametrize("reader", WRITERS)
def test_four_workers_get_no_data_finding(tmp_path, reader):
    a = full_analysis(WRITERS[reader](loader_run("_MultiProcessingDataLoaderIter", 0.2), tmp_path))
    assert "data_loading" not in ids(a) and a.gpu_busy_pct > 95


# 3. CUDA graphs: the gap ends with work queued before the host entered cudaDeviceSynchronize.
def graph_run(graphs: bool, steps: int = 5) -> tuple[Run, int]:
    """Per step: K1 (20 ms), a 6 ms gap, K2 (34 ms). With `graphs`, one cudaGraphLaunch queues both
    and the host syncs until the step is done; without, the host syncs on K1 (an .item()), spends
    6 ms, then launches K2. Returns the run and the sync-caused idle ns per step (the truth)."""
    run = Run()
    t, truth = 0, 0
    for i in range(steps):
        host0 = t
        if graphs:
            corr = call(run, t, t + 50 * US, "cudaGraphLaunch_v10000")
            run.kernels.append((t + 100 * US, t + 20 * MS, GEMM, corr))
            run.kernels.append((t + 26 * MS, t + 60 * MS, GEMM, corr))
            call(run, t + 500 * US, t + 60 * MS + 10 * US, "cudaDeviceSynchronize_v3020")
            t += 60 * MS + 60 * US  # the next step's launch, 60 us after the GPU went idle: the sync's due
            truth = 60 * US + 100 * US  # the next graph's first kernel starts 100 us after its launch
        else:
            run.launch(t, t + 100 * US, 20 * MS - 100 * US, GEMM)
            call(run, t + 500 * US, t + 20 * MS + 10 * US, "cudaDeviceSynchronize_v3020")
            run.launch(t + 26 * MS, t + 26 * MS, 34 * MS, GEMM)
            t += 60 * MS
            truth = 6 * MS
        run.ranges.append((f"step {i}", host0, t, MAIN_TID))
    return run, truth


@pytest.mark.parametrize("reader", WRITERS)
def test_work_queued_before_a_sync_is_not_host_sync(tmp_path, reader):
    run, truth = graph_run(graphs=True)
    a = full_analysis(WRITERS[reader](run, tmp_path))
    steps = len(a.window["steps"])
    # Only the gaps ended by a launch after the sync returned count: 100 us of each 60 ms step.
    assert a.gaps["causes_ns"]["sync"] == (steps - 1) * truth
    assert a.gaps["causes_ns"]["unattributed"] >= steps * (6 * MS - 1)
    assert "host_sync" not in ids(a)


@pytest.mark.parametrize("reader", WRITERS)
def test_without_graphs_the_sync_is_host_sync_as_before(tmp_path, reader):
    run, truth = graph_run(graphs=False)
    a = full_analysis(WRITERS[reader](run, tmp_path))
    steps = len(a.window["steps"])
    assert a.gaps["causes_ns"]["sync"] == steps * truth
    found = by_id(a, "host_sync")
    assert found.evidence["sync_ms_per_step"] == pytest.approx(6.0)
    assert [g["ms"] for g in found.evidence["longest_gaps"]] == [6.0] * min(steps, 5)


# 4. A stub last ProfilerStep (0.05 ms, launching nothing) after the one real step.
@pytest.mark.parametrize("reader", WRITERS)
def test_a_stub_step_is_dropped_before_warmup(tmp_path, reader):
    run = training_run(lambda i: f"ProfilerStep#{i}", steps=1, warmup=False)
    end = max(e for _, _, e, _ in run.ranges)
    run.ranges.append(("ProfilerStep#1", end + 10 * US, end + 60 * US, MAIN_TID))
    a = full_analysis(WRITERS[reader](run, tmp_path))
    assert a.window["steps"] == [0] and a.window["warmup_steps"] == []
    assert a.window["stub_steps"] == [{"step": 1, "start_ns": end + 10 * US, "end_ns": end + 60 * US}]
    assert (a.window["start_ns"], a.window["end_ns"]) == run.steady_span
    assert "profile_health" not in ids(a)


def test_a_short_step_that_launches_work_stays(tmp_path):
    run = training_run(lambda i: f"step {i}", steps=3, warmup=False)
    first = next(k for k in run.kernels if k[0] > max(e for _, _, e, _ in run.ranges)) if False else None
    assert first is None  # every kernel is inside a step here
    end = max(e for _, _, e, _ in run.ranges)
    run.launch(end + 20 * US, end + 30 * US, 10 * US, GEMM)  # a tiny step, but it launches work
    run.ranges.append(("step 3", end + 10 * US, end + 60 * US, MAIN_TID))
    a = full_analysis(write_torch(run, tmp_path / "t.json"))
    assert a.window["stub_steps"] == [] and a.window["steps"][-1] == 3


# 5. nsys: a blocking cudaMemcpy_v3020 synchronises (the LIKE patterns escape their "_").
def memcpy_run(call_name: str, steps: int = 5) -> Run:
    run = Run()
    t = 0
    for i in range(steps):
        host0, gpu = t, t + 50 * US
        for j in range(10):
            gpu = run.launch(t + j * 5 * US, gpu, 500 * US, GEMM)
        corr = call(run, t + 100 * US, gpu + 30 * US, call_name)  # the host waits for the GEMMs and the copy
        run.copies.append((gpu, gpu + 20 * US, 4096, 2, 2, 0, corr))
        t = gpu + 30 * US + 1 * MS  # 1 ms on the host before the next step launches
        run.ranges.append((f"step {i}", host0, t, MAIN_TID))
    return run


def test_blocking_cudamemcpy_is_host_sync_in_nsys(tmp_path):
    run = memcpy_run("cudaMemcpy_v3020")
    a = full_analysis(write_nsys(run, tmp_path / "profile.sqlite"))
    steps = len(a.window["steps"])
    # Each gap: from the copy's end to the next step's first GEMM (launched after the call returned).
    assert a.gaps["causes_ns"]["sync"] == (steps - 1) * (10 * US + 1 * MS + 50 * US)
    async_run = full_analysis(write_nsys(memcpy_run("cudaMemcpyAsync_v3020"), tmp_path / "async.sqlite"))
    assert async_run.gaps["causes_ns"]["sync"] == 0  # an async copy does not hold the host


def test_sync_patterns_match_the_calls_they_name(tmp_path):
    con = sqlite3.connect(tmp_path / "names.sqlite")
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    names = ["cudaMemcpy_v3020", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cudaMemcpyAsync_v3020", "cudaMemcpyXv3020"]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names, 1)))
    matched = {names[i - 1] for i in nsys_db.names_like(con, SYNC_CALLS)}
    assert matched == {"cudaMemcpy_v3020", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}


# 6. Timesteps of 125 kernels whose halves alternate direction: the period is 125, not 250.
@pytest.mark.parametrize("reader", WRITERS)
def test_the_shortest_period_that_explains_the_sequence(tmp_path, reader):
    run = Run()
    t = 0
    for step in range(8):
        gpu = t + 20 * US
        for j in range(125):
            name = f"void stencil_{j}<float>()" if j % 25 else f"void sweep_{j}_{'xy'[step % 2]}<float>()"
            gpu = run.launch(t + j * US, gpu + 1 * US, 40 * US, name)
        t = gpu + 2 * MS  # the host between timesteps
    a = full_analysis(WRITERS[reader](run, tmp_path))
    assert a.window["basis"] == "inferred steps" and "repeats every 125 kernels" in a.window["source"]
    assert len(a.window["steps"]) + len(a.window["warmup_steps"]) == 8
    assert a.step_ms["median"] == pytest.approx((125 * 41 * US + 2 * MS) / 1e6, rel=0.01)


# 7. A 100 ms step whose GPU work is one 2 us kernel: the GPU idles for the step.
@pytest.mark.parametrize("reader", WRITERS)
def test_a_mostly_cpu_step_covers_the_step(tmp_path, reader):
    run = Run()
    for i in range(3):
        t = i * 100 * MS
        run.launch(t + 50 * MS, t + 50 * MS + 10 * US, 2 * US, GEMM)
        run.ranges.append((f"step {i}", t, t + 100 * MS, MAIN_TID))
    a = full_analysis(WRITERS[reader](run, tmp_path))
    assert (a.window["start_ns"], a.window["end_ns"]) == (0, 300 * MS)
    assert a.gpu_busy_pct == pytest.approx(100 * 3 * 2 * US / (300 * MS))
    assert a.gaps["total_ns"] == 300 * MS - 3 * 2 * US  # the idle time counts, edges included
    assert by_id(a, "gpu_starved").evidence["idle_ms_per_step"] == pytest.approx(100 - 0.002)


# 8. One 3 s first launch (module load) is not "launch bound"; many late launches are.
def launches(first_launch_ns: int, gap_ns: int) -> Run:
    run = Run()
    run.launch(0, 10 * US, 5 * US, "void first_kernel()")
    run._corr += 1
    run.calls.append((20 * US, 20 * US + first_launch_ns, "cudaLaunchKernel_v7000", run._corr))
    gpu = 20 * US + first_launch_ns + 5 * US
    run.kernels.append((gpu, gpu + 5 * US, "void loaded_kernel()", run._corr))
    host = gpu
    for _ in range(2000):  # short kernels, each launched gap_ns after the previous one ended
        host += 5 * US + gap_ns
        run.launch(host - 3 * US, host, 5 * US, "void small_kernel()")
    return run


@pytest.mark.parametrize("reader", WRITERS)
def test_one_slow_first_launch_is_not_launch_bound(tmp_path, reader):
    a = full_analysis(WRITERS[reader](launches(3_000 * MS, 2 * US), tmp_path))
    assert a.window["basis"] == "whole trace" and a.gaps["causes_ns"]["launch_latency"] >= 3_000 * MS
    assert a.kernels["launch_api_max_ns"] == 3_000 * MS
    assert "launch_bound" not in ids(a)


@pytest.mark.parametrize("reader", WRITERS)
def test_many_late_launches_are_launch_bound(tmp_path, reader):
    a = full_analysis(WRITERS[reader](launches(5 * US, 20 * US), tmp_path))
    found = by_id(a, "launch_bound")
    assert found.evidence["launch_latency_pct"] > 50
    assert [g["ms"] for g in found.evidence["longest_gaps"]] == pytest.approx([0.02] * 5, abs=1e-3)
    # Neither trace recorded the OS's waits: a late launch may have been one, and the finding says so.
    assert not a.gaps["os_waits_traced"] and "did not record" in found.message


def test_late_launches_with_the_os_waits_traced_and_none_of_them_waiting_are_launch_bound_outright(tmp_path):
    path = WRITERS["nsys"](launches(5 * US, 20 * US), tmp_path)
    with sqlite3.connect(path) as con:  # osrt on: its table, with no wait of the launching thread in it
        con.execute("CREATE TABLE OSRT_API (start INTEGER, end INTEGER, globalTid INTEGER, nameId INTEGER)")
    a = full_analysis(path)
    found = by_id(a, "launch_bound")
    assert a.gaps["os_waits_traced"] and "did not record" not in found.message
    assert "launch fewer, larger kernels" in found.message


# 9. Wording.
def test_transfer_dominated_only_when_transfers_are_the_majority():
    assert balance_words(95) == "compute-dominated"
    assert balance_words(80).startswith("mostly compute")  # 74-89% kernels: not "transfer-dominated"
    assert balance_words(40) == "transfer-dominated"


def test_a_non_cuda_accelerator_is_not_called_a_cpu_run(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5} for i in range(10)
    ] + [{"ph": "X", "cat": "mtia_ccp_events", "name": "mm_kernel", "pid": 2, "tid": 2, "ts": 12, "dur": 3}]
    path = tmp_path / "mtia.json"
    path.write_text(json.dumps({"traceEvents": events}))
    a = full_analysis(path)
    assert a.source["device"] == "accelerator" and a.source["accelerator_categories"] == ["mtia_ccp_events"]
    text = " ".join(a.summary)
    assert "CPU run" not in text and "mtia_ccp_events" in text


# Damaged traces: a health finding, never numbers printed as if sound.
def test_negative_durations_and_kernels_inside_their_predecessor_are_health_findings(tmp_path):
    run = training_run(lambda i: f"step {i}")
    s, e, name, corr = run.kernels[-10]
    run.kernels[-10] = (s, s - 50 * US, name, corr)  # ends before it starts
    s, e, name, corr = run.kernels[-20]
    run.kernels.append((s + 10 * US, e - 10 * US, name, corr))  # inside another kernel of its stream
    for reader, write in WRITERS.items():
        a = full_analysis(write(run, tmp_path))
        messages = [f.message for f in a.findings if f.id == "profile_health"]
        assert any(m.startswith("1 kernels end before they start") for m in messages), reader
        assert any(m.startswith("1 kernels run inside the previous one of their stream") for m in messages), reader
    out = subprocess.run(
        [sys.executable, "-m", "ghsweep.analyze", str(tmp_path / "trace.json")], capture_output=True, text=True
    )
    assert out.returncode == 0 and "end before they start" in out.stdout


def test_shares_over_100_percent_are_a_health_finding():
    a = ProfileAnalysis(kernel_time_pct=130.0, gpu_busy_pct=99.0, top_kernels=[{"name": "k", "pct": 140.0}])
    found = [f for f in health(a) if f.id == "profile_health"]
    assert len(found) == 1 and "kernel_time_pct 130.0%" in found[0].message
    assert found[0].evidence == {"kernel_time_pct": 130.0, "top kernel k": 140.0}
    assert health(ProfileAnalysis(kernel_time_pct=100.0, gpu_busy_pct=99.0)) == []


def test_the_report_lists_the_gaps_behind_the_numbers(tmp_path):
    run, _ = graph_run(graphs=False)
    a = full_analysis(write_torch(run, tmp_path / "t.json"))
    text = profile_report.render(a)
    gap = by_id(a, "host_sync").evidence["longest_gaps"][0]
    assert f"| sync | {gap['start_ns']} | {gap['end_ns']} | 6.000 |" in text


def test_rocm_sync_calls_are_host_sync_too(tmp_path):
    run, truth = graph_run(graphs=False)
    run.calls = [(s, e, n.replace("cudaDeviceSynchronize", "hipDeviceSynchronize"), c) for s, e, n, c in run.calls]
    a = full_analysis(write_torch(run, tmp_path / "rocm.json"))
    assert a.gaps["causes_ns"]["sync"] == len(a.window["steps"]) * truth
