"""Profiles made by other training loops (planted.py): steps found whatever the loop calls them,
or from the GPU work; the whole trace only as the last resort, said so; warm-up excluded from two
captured steps on; the nsys and PyTorch-trace readers agree on the same run."""

from __future__ import annotations

import pytest

from ghsweep.profile.run_analysis import full_analysis
from ghsweep.profile.steps import Step, Steps, split_warmup, step_kind, without_stubs
from tests.profile.planted import US, training_run, write_nsys, write_torch

CONVENTIONS = {
    "step N": lambda i: f"step {i}",
    "stepN": lambda i: f"step{i}",
    "step_N": lambda i: f"step_{i}",
    "Step N": lambda i: f"Step {i}",
    "iteration N": lambda i: f"iteration {i}",
    "iterN": lambda i: f"iter{i}",
    "train_step": lambda i: "train_step",
    "training_step N": lambda i: f"training_step {i}",
    "ProfilerStep#N": lambda i: f"ProfilerStep#{i}",
    "Batch N": lambda i: f"Batch {i}",
    "module.train_step": lambda i: "megatron.training.train_step",
}
WRITERS = {
    "nsys": lambda run, d: write_nsys(run, d / "profile.sqlite"),
    "torch": lambda run, d: write_torch(run, d / "trace.json"),
}


def analysed(run, tmp_path, reader: str) -> dict:
    return full_analysis(WRITERS[reader](run, tmp_path))


@pytest.mark.parametrize("reader", WRITERS)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_steps_of_any_naming_convention(tmp_path, reader, convention):
    run = training_run(CONVENTIONS[convention])
    a = analysed(run, tmp_path, reader)
    window = a.window
    assert window["basis"] == "nvtx steps"
    assert window["warmup_steps"] == [0] and window["steps"] == [1, 2, 3, 4, 5]
    assert "slower than 1.5x the median" in window["warmup_reason"]
    assert (window["start_ns"], window["end_ns"]) == run.steady_span
    assert a.gpu_busy_pct == pytest.approx(100 * run.steady_busy_ns / (run.steady_span[1] - run.steady_span[0]))
    assert a.findings == [], a.findings  # a clean compute-bound run: no start-up in the window


@pytest.mark.parametrize("reader", WRITERS)
def test_nested_ranges_on_another_thread_pick_the_outer_step(tmp_path, reader):
    a = analysed(training_run(lambda i: f"iteration {i}", nested="train_step"), tmp_path, reader)
    assert a.window["source"].endswith('named like "iteration N"')
    assert a.window["steps"] == [1, 2, 3, 4, 5]
    a = analysed(training_run(None, nested="train_step"), tmp_path, reader)  # the inner ranges alone still count
    assert a.window["basis"] == "nvtx steps" and a.window["steps"] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("reader", WRITERS)
def test_steps_inferred_from_optimizer_bursts(tmp_path, reader):
    run = training_run(None)
    a = analysed(run, tmp_path, reader)
    assert a.window["basis"] == "inferred steps"
    assert "optimizer kernels (multi_tensor_apply_kernel)" in a.window["source"]
    assert a.window["warmup_steps"] == [0] and a.window["steps"] == [1, 2, 3, 4, 5]
    warmup_end = max(e for s, e, _, _ in run.kernels if s < run.steady_span[0])
    assert (a.window["start_ns"], a.window["end_ns"]) == (warmup_end, run.steady_span[1])
    assert a.findings == [], a.findings
    assert any("steps from the GPU work" in line for line in a.summary)


@pytest.mark.parametrize("reader", WRITERS)
def test_steps_inferred_from_the_period_of_the_kernels(tmp_path, reader):
    """No optimizer kernel by name (a hand-written update): the kernel launched once per step and
    followed by the host's time between steps marks the step's end."""
    run = training_run(
        None,
        burst=("void scale_grads_kernel<float>()", "void apply_update_kernel<float>(float*)"),
        loss="void cross_entropy_kernel<float>()",
    )
    a = analysed(run, tmp_path, reader)
    assert a.window["basis"] == "inferred steps"
    assert a.window["source"].endswith("repeats every 43 kernels, one step each, ending at apply_update_kernel")
    assert a.window["warmup_steps"] == [0] and a.window["steps"] == [1, 2, 3, 4, 5]
    # A step seen on the GPU runs from the end of the previous step's update to the end of its own.
    warmup_end = max(e for s, e, _, _ in run.kernels if s < run.steady_span[0])
    assert (a.window["start_ns"], a.window["end_ns"]) == (warmup_end, run.steady_span[1])
    assert a.findings == [], a.findings


@pytest.mark.parametrize("reader", WRITERS)
def test_whole_trace_is_the_last_resort_and_says_so(tmp_path, reader):
    run = training_run(None, burst=())  # nothing repeats once per step
    a = analysed(run, tmp_path, reader)
    assert a.window["basis"] == "whole trace" and a.window["steps"] == [] and a.window["warmup_steps"] == []
    health = [f for f in a.findings if f.id == "profile_health"]
    assert health and "no step ranges" in health[0].message and "whole trace" in health[0].message
    text = " ".join([f.message for f in a.findings] + a.summary)
    assert "steady" not in text and "per step" not in text and "of the whole trace" in text
    assert {"gpu_starved", "pageable_copies"} <= {f.id for f in a.findings}  # start-up is in the window


@pytest.mark.parametrize("reader", WRITERS)
def test_two_captured_steps_exclude_a_slow_first(tmp_path, reader):
    run = training_run(lambda i: f"step {i}", steps=2)
    a = analysed(run, tmp_path, reader)
    assert a.window["warmup_steps"] == [0] and a.window["steps"] == [1]
    assert a.gpu_busy_pct > 95
    assert {f.id for f in a.findings}.isdisjoint({"gpu_starved", "launch_bound"})
    assert any(line.startswith("warm-up excluded: step 0") for line in a.summary)


def test_the_step_a_capture_began_in_is_warm_up(tmp_path):
    """nsys from a cudaProfilerStart on (ghsweep's window, --capture-range=cudaProfilerApi): the first
    step is warm-up even at the steady steps' pace; without the call it is a steady step."""
    run = training_run(lambda i: f"step {i}", warmup=False)
    plain = full_analysis(write_nsys(run, tmp_path / "plain.sqlite"))
    assert plain.window["warmup_steps"] == [] and plain.window["steps"] == [0, 1, 2, 3, 4, 5]
    first_step_at = min(start for _, start, _, _ in run.ranges)
    run.calls.append((first_step_at - 50 * US, first_step_at - 10 * US, "cuProfilerStart", 1))
    captured = full_analysis(write_nsys(run, tmp_path / "captured.sqlite"))
    assert captured.window["warmup_steps"] == [0] and captured.window["steps"] == [1, 2, 3, 4, 5]
    assert captured.window["warmup_reason"] == "step 0: the capture's first, where the profiler started"


def test_a_capture_start_outlives_its_stubs():
    steps = [Step(0, 0, 1_000), *(Step(i, i * 100_000_000, (i + 1) * 100_000_000) for i in range(1, 5))]
    kept = without_stubs(Steps(steps, capture_start=True), launches_work=lambda step: False)
    assert [s.step for s in kept.stubs] == [0]
    assert [s.step for s in kept.warmup] == [1] and [s.step for s in kept.steady] == [2, 3, 4]


def test_warmup_rule():
    two = [Step(0, 0, 190), Step(1, 190, 290)]  # 1.9x: noise between two single steps, not warm-up
    assert split_warmup(two) == ([], two, "")
    warm, steady, why = split_warmup([Step(0, 0, 40_000_000), Step(1, 40_000_000, 50_000_000)])
    assert [s.step for s in warm] == [0] and [s.step for s in steady] == [1]
    assert why == "step 0 40.0 ms: slower than 2.0x the median 10.0 ms of the 1 steps after"
    many = [Step(0, 0, 160), *(Step(i, 100 * i, 100 * i + 100) for i in range(1, 5))]  # 1.6x the median of 4
    assert [s.step for s in split_warmup(many)[0]] == [0]


def test_step_names():
    assert step_kind("ProfilerStep#12") == ("profilerstep", 12)
    assert step_kind("step_3") == step_kind("Step 3") == step_kind("step3") == ("step", 3)
    assert step_kind("train_step") == step_kind("megatron.train_step") == ("trainstep", None)
    assert step_kind("[pl][profile][Strategy]SingleDeviceStrategy.training_step") == ("trainingstep", None)
    assert step_kind("[pl][profile]run_training_batch") == ("runtrainingbatch", None)
    assert step_kind("Batch 3") == ("batch", 3) and step_kind("NeMo/step_5") == ("step", 5)
    for not_a_step in (
        "Optimizer.step#AdamW.step",
        "Optimizer.zero_grad#AdamW.zero_grad",
        "optimizer_step",
        "forward_step",
        "get_batch",
        "batch",
        "steps",
        "data",
        "stepping 3",
        "cub::DeviceScan",
    ):
        assert step_kind(not_a_step) is None, not_a_step


def test_nsys_and_torch_readers_agree_on_the_same_run(tmp_path):
    run = training_run(lambda i: f"step {i}")
    nsys, torch = analysed(run, tmp_path, "nsys"), analysed(run, tmp_path, "torch")
    assert nsys.gpu_busy_pct == pytest.approx(torch.gpu_busy_pct, abs=0.01)
    assert [k["name"] for k in nsys.top_kernels] == [k["name"] for k in torch.top_kernels]
    assert [k["short_name"] for k in nsys.top_kernels] == [k["short_name"] for k in torch.top_kernels]
    for key in ("kernel_count", "kernel_total_ns", "distinct_kernels", "memory_ops"):
        assert nsys.whole_trace[key] == torch.whole_trace[key], key


def test_bare_array_and_gzip_traces(tmp_path):
    run = training_run(lambda i: f"step {i}")
    plain = full_analysis(write_torch(run, tmp_path / "a.json"))
    for path in (write_torch(run, tmp_path / "b.json", array=True), write_torch(run, tmp_path / "c.json.gz")):
        assert full_analysis(path).gpu_busy_pct == plain.gpu_busy_pct
