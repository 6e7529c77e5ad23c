"""The sweep comparison read back from a real MLflow store: speedups, Pareto front, findings, plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from ghsweep.core.errors import SweepNotFound
from ghsweep.core.names import ROLE_SWEEP, RUN_IDS_TAG
from ghsweep.report import compare
from ghsweep.report.sweep_source import SweepRun, find_run, load_sweep
from ghsweep.report.sweep_table import align
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.report.sweeps import four_run_sweep, log_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> tuple[MlflowStore, Path]:
    """One SQLite store for the module (creating one costs seconds); each test adds its own parent run."""
    tmp = tmp_path_factory.mktemp("report_db")
    return MlflowStore(f"sqlite:///{tmp / 'mlflow.db'}", "report_test"), tmp


@pytest.fixture(scope="module")
def sweep(db):
    store, tmp = db
    _, parent, ids = four_run_sweep(store, tmp)
    return store, store.get_run(parent), ids


def test_runs_come_back_in_job_order_with_their_analysis(sweep):
    store, parent, ids = sweep
    runs = load_sweep(store, parent)
    assert [r.run_id for r in runs] == ids
    assert [r.status for r in runs] == ["FINISHED", "FINISHED", "FINISHED", "FAILED"]
    assert runs[0].knobs == {"precision": "fp32", "offload": "off"}
    assert runs[0].loss == [(0, 4.0), (1, 3.5), (2, 3.0)]
    assert runs[2].analysis.top_kernels[0]["name"] == "gemm_bf16"
    assert runs[3].analysis is None and runs[3].error.startswith("precision=fp8")


def test_speedups_pareto_and_verdict(sweep):
    store, parent, _ = sweep
    c = compare.build(parent.name, load_sweep(store, parent))
    assert c.baseline == 0
    assert c.speedups == [1.0, 0.8, 2.0, None]
    # #0 has less throughput and more memory than #2; #1 has the least memory; #3 failed.
    assert c.pareto == {1, 2}
    assert c.fastest == 2
    text = "\n".join(compare.verdict(c))
    assert "3 of 4 combinations finished." in text
    assert (
        "Fastest: #2 bf16 off: 2.00x (no interval: too few steady steps to tell it from noise) against the "
        "baseline, at 0.80x the baseline's peak memory." in text
    )
    assert "#3 fp8 off FAILED: precision=fp8: needs an NVIDIA GPU" in text


def test_table_shows_dash_for_missing_metrics_and_the_worst_finding(sweep):
    store, parent, _ = sweep
    header, rows = compare.table(compare.build(parent.name, load_sweep(store, parent)))
    col = {h: i for i, h in enumerate(header)}
    assert [r[col["speedup"]] for r in rows] == ["baseline", "0.80x ±?", "2.00x ±?", "-"]
    assert [r[col["TFLOP/s"]] for r in rows] == ["50", "-", "-", "-"]
    assert all(r[col["MFU"]] == "-" for r in rows)
    assert rows[1][col["top finding / error"]] == "offload adds 12 ms of exposed copies"
    assert rows[3][col["top finding / error"]].startswith("precision=fp8: needs")
    assert [r[col["Pareto"]] for r in rows] == ["", "yes", "yes", ""]


def test_baseline_by_job_number_by_overrides_and_bad_value(sweep):
    store, parent, _ = sweep
    runs = load_sweep(store, parent)
    assert compare.build("s", runs, "2").speedups == [0.5, 0.4, 1.0, None]
    assert compare.build("s", runs, "precision=fp32 offload=on").baseline == 1
    with pytest.raises(compare.BaselineError, match=r"^report.baseline=precision=fp16: matches no combination"):
        compare.build("s", runs, "precision=fp16")
    # An explicitly chosen failed baseline gives no speedups rather than a silent substitute.
    assert compare.build("s", runs, 3).speedups == [None] * 4


def test_first_finished_run_is_the_default_baseline(db, tmp_path):
    store, _ = db
    parent = store.start_run("sweep x", ROLE_SWEEP, {})
    log_run(store, tmp_path, parent, 0, ["peft=none"], "FAILED", {}, [], error="out of memory")
    log_run(
        store,
        tmp_path,
        parent,
        1,
        ["peft=lora"],
        "FINISHED",
        {"tokens_per_s": 10.0, "peak_mem_gb": 1.0},
        [1.0],
        params={"report.baseline": "None"},
    )
    c = compare.build("x", load_sweep(store, store.get_run(parent)))
    assert c.baseline == 1 and c.speedups == [None, 1.0]


def test_configured_baseline_is_read_from_the_runs_params(db, tmp_path):
    store, _ = db
    parent = store.start_run("sweep y", ROLE_SWEEP, {})
    for job, (peft, tps) in enumerate((("lora", 10.0), ("none", 20.0))):
        log_run(
            store,
            tmp_path,
            parent,
            job,
            [f"peft={peft}"],
            "FINISHED",
            {"tokens_per_s": tps, "peak_mem_gb": 1.0},
            [1.0],
            params={"report.baseline": "peft=none"},
        )
    c = compare.build("y", load_sweep(store, store.get_run(parent)))
    assert c.baseline == 1 and c.speedups == [0.5, 1.0]


def test_a_configured_baseline_of_several_overrides_in_quotes_is_found(db, tmp_path):
    # `'report.baseline="precision=bf16 offload=off"'` on the command line: every combination's overrides
    # carry the quoted value, spaces and all; it must not split into stray overrides.
    store, _ = db
    parent = store.start_run("sweep q", ROLE_SWEEP, {})
    chosen = 'report.baseline="precision=bf16 offload=off"'
    for job, (precision, offload, tps) in enumerate((("bf16", "on", 10.0), ("bf16", "off", 20.0))):
        log_run(
            store,
            tmp_path,
            parent,
            job,
            [f"precision={precision}", f"offload={offload}", chosen],
            "FINISHED",
            {"tokens_per_s": tps, "peak_mem_gb": 1.0},
            [1.0],
            params={"report.baseline": "precision=bf16 offload=off"},
        )
    runs = load_sweep(store, store.get_run(parent))
    assert runs[0].overrides == ["precision=bf16", "offload=on", chosen]
    c = compare.build("q", runs)
    assert c.baseline == 1 and c.speedups == [0.5, 1.0]


def run(job: int, tokens_per_s: float, peak_mem_gb: float, half_width_pct: float | None = None) -> SweepRun:
    """A finished run with tokens/s, its interval (when given) and peak memory."""
    metrics = {"tokens_per_s": tokens_per_s, "peak_mem_gb": peak_mem_gb}
    if half_width_pct is not None:
        half = tokens_per_s * half_width_pct / 100
        metrics |= {"tokens_per_s_ci_low": tokens_per_s - half, "tokens_per_s_ci_high": tokens_per_s + half}
    return SweepRun(f"r{job}", f"r{job}", job, "FINISHED", [f"precision=p{job}"], {}, metrics, {})


def test_runs_that_differ_only_in_a_knob_with_no_effect_are_said_to_have_trained_the_same():
    # The CPU headline sweep as a user saw it: offload=on did nothing there, yet the machine's load
    # moved between the runs by more than their intervals.
    def cpu_run(job: int, offload: str, tokens_per_s: float, applied: str) -> SweepRun:
        r = run(job, tokens_per_s, 0.55, 1.0)
        r.overrides = ["precision=bf16", f"offload={offload}"]
        r.tags = {"ghsweep.offload_applied": applied}
        return r

    same = compare.build("cpu", [cpu_run(0, "on", 32.0, "False"), cpu_run(1, "off", 30.0, "False")])
    text = "\n".join(compare.verdict(same))
    assert (
        "#1 off against the baseline: 0.94x (95% interval 0.92-0.95x); the two trained the same way here "
        "(offload had no effect), so this is run-to-run variation, not the knob." in text
    )
    # Where offload was applied the difference is the knob's, and nothing is added.
    gpu = compare.build("gpu", [cpu_run(0, "on", 32.0, "True"), cpu_run(1, "off", 30.0, "False")])
    assert "run-to-run variation" not in "\n".join(compare.verdict(gpu))


def test_pareto_front_handles_ties_and_single_points():
    assert compare.pareto_front([]) == set()
    assert compare.pareto_front([run(0, 5.0, 1.0)]) == {0}
    # Equal points do not dominate each other; (4, 2) is beaten by both.
    assert compare.pareto_front([run(0, 5.0, 1.0), run(1, 5.0, 1.0), run(2, 4.0, 2.0)]) == {0, 1}


def test_differences_inside_the_noise_are_ties_not_speedups():
    # The CPU smoke sweep as a user saw it: offload does nothing there, 1 MiB of memory apart.
    runs = [run(0, 1000.0, 0.4594, 3.0), run(1, 1010.0, 0.4583, 3.0), run(2, 1500.0, 0.4590, 2.0)]
    c = compare.build("noise", runs)
    assert c.speedup_intervals[1] is not None and c.speedup_intervals[1].contains(1.0)
    header, rows = compare.table(c)
    col = {h: i for i, h in enumerate(header)}
    assert rows[1][col["speedup"]] == "=1 (±5.4%)" and rows[0][col["tokens/s"]] == "1,000 ±3.0%"
    assert rows[2][col["speedup"]] == "1.50x [1.45, 1.56]"
    # #2 is measurably faster at the same memory (1 MiB apart is no difference): the only point on the front.
    assert c.pareto == {2}
    text = "\n".join(compare.verdict(c))
    assert "#1 p1 against the baseline: no measurable difference (within ±5.4%)." in text
    assert "Fastest: #2 p2: 1.50x (95% interval 1.45-1.56x)" in text
    # Two runs within each other's noise are both the fastest, and a tie on the front.
    tied = compare.build("tied", [run(0, 1000.0, 2.0, 1.0), run(1, 1500.0, 1.0, 1.0), run(2, 1505.0, 1.0, 1.0)])
    assert tied.fastest_tied == [2, 1] and tied.pareto == {1, 2}
    assert "Fastest: #2 p2 (tied within noise: #1 p1)" in "\n".join(compare.verdict(tied))
    _, rows = compare.table(tied)
    assert [r[col["Pareto"]] for r in rows] == ["", "yes (tie: #2)", "yes (tie: #1)"]


def test_report_files_markdown_html_and_four_plots(sweep, tmp_path):
    store, parent, _ = sweep
    c, files = compare.compare_sweep(store, parent, tmp_path / "out")
    names = sorted(f.name for f in files)
    assert names == [
        "comparison.html",
        "comparison.md",
        "kernel_shares.png",
        "loss_curves.png",
        "speedup.png",
        "throughput_vs_memory.png",
    ]
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == PNG_MAGIC and f.stat().st_size > 5000, f
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert "| 2 | bf16 | off | FINISHED | 100.0 | 2,000 ±? | 2.00x ±? |" in md
    assert "![Kernel-time shares](plots/kernel_shares.png)" in md
    page = (tmp_path / "out" / "comparison.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "<td>offload adds 12 ms of exposed copies</td>" in page


def test_plots_missing_data_are_said_not_drawn(db, tmp_path):
    store, _ = db
    parent = store.start_run("sweep z", ROLE_SWEEP, {})
    log_run(store, tmp_path, parent, 0, ["precision=fp8"], "FAILED", {}, [], error="no GPU")
    c, files = compare.compare_sweep(store, store.get_run(parent), tmp_path / "out")
    assert [f.name for f in files] == ["comparison.md", "comparison.html"]
    md = files[0].read_text()
    assert "No combination finished, so there is nothing to compare." in md
    assert "No plot: no run has a profile analysis with top kernels" in md


def test_find_sweep_by_name_with_or_without_prefix_and_by_id(sweep):
    store, parent, ids = sweep
    assert find_run(store, "sweep 2026-01-01/00-00-00", "sweep").run_id == parent.run_id
    assert find_run(store, "2026-01-01/00-00-00", "sweep").run_id == parent.run_id
    assert find_run(store, parent.run_id, "sweep").run_id == parent.run_id
    with pytest.raises(SweepNotFound, match=r"^run [0-9a-f]{32} is a ghsweep run run, not a sweep run$"):
        find_run(store, ids[0], "sweep")
    missing = "^'2020-01-01/00-00-00': no run of that name or id with tag ghsweep.role=sweep in "
    with pytest.raises(SweepNotFound, match=missing) as err:
        find_run(store, "2020-01-01/00-00-00", "sweep")
    assert "'sweep 2026-01-01/00-00-00'" in str(err.value).partition("newest sweep runs there: ")[2]


def test_runs_listed_on_the_parent_include_runs_reused_from_an_earlier_sweep(db, tmp_path):
    store, _ = db
    earlier = store.start_run("sweep earlier", ROLE_SWEEP, {})
    reused = log_run(store, tmp_path, earlier, 1, ["peft=none"], "FINISHED", {"tokens_per_s": 30.0}, [1.0])
    parent = store.start_run("sweep resumed", ROLE_SWEEP, {})
    fresh = log_run(store, tmp_path, parent, 0, ["peft=lora"], "FINISHED", {"tokens_per_s": 10.0}, [1.0])
    assert [r.run_id for r in load_sweep(store, store.get_run(parent))] == [fresh]
    store.set_tags(parent, {RUN_IDS_TAG: f"{fresh},{reused}"})
    runs = load_sweep(store, store.get_run(parent))
    assert [(r.run_id, r.job_num) for r in runs] == [(fresh, 0), (reused, 1)]
    assert compare.build("resumed", runs).speedups == [1.0, 3.0]


def test_scaling_efficiency_is_per_gpu_throughput_over_the_one_gpu_twin():
    runs = [
        (["peft=lora", "backend.gpus_per_node=1"], {"tokens_per_s": 1000.0, "world_size": 1}),
        (["peft=lora", "backend.gpus_per_node=2"], {"tokens_per_s": 1900.0, "world_size": 2}),
        (["peft=lora", "backend.num_nodes=2", "backend.gpus_per_node=2"], {"tokens_per_s": 3600.0, "world_size": 4}),
        # No finished one-GPU twin: nothing to scale against.
        (["peft=none", "backend.gpus_per_node=1"], None),
        (["peft=none", "backend.gpus_per_node=2"], {"tokens_per_s": 900.0, "world_size": 2}),
        (["peft=lora", "backend.gpus_per_node=2", "precision=fp8"], {"tokens_per_s": 2500.0, "world_size": 2}),
    ]
    assert compare.scaling_efficiency(runs) == pytest.approx([None, 0.95, 0.9, None, None, None])


@pytest.mark.parametrize("knob", ["repeat", "seed"])
def test_repeats_differ_only_in_repeat_or_seed_and_report_both_spreads(knob):
    runs = [run(0, 17491.0, 20.0, 0.4), run(1, 17507.0, 20.0, 0.3), run(2, 17498.0, 20.0, 0.5), run(3, 9000.0, 10.0)]
    # Interleaved as `repeat=1,2,3 precision=...` runs them; the fp32 run has no repeat of its own.
    for r, n in zip(runs, ("1", "2", "3", "1")):
        r.overrides[:] = [f"{knob}={n}", f"precision={'bf16' if r.job_num != 3 else 'fp32'}"]
    c = compare.build("repeats", runs)
    assert compare.repeat_groups(c) == [[0, 1, 2]]
    text = "\n".join(compare.verdict(c))
    assert "Repeats #0, #1, #2: tokens/s 17,491-17,507, 0.09% apart between repeats, ±0.50% within the widest" in text
    assert "together 17,499 ±0.50%." in text


def test_runs_measured_under_different_load_get_no_speedup():
    # Two identical fp32 runs as a user saw them on a busy 2-core machine: 176 and 103 tokens/s.
    quiet, contended = run(0, 176.0, 0.55, 1.0), run(1, 103.0, 0.55, 1.0)
    contended.tags = {"ghsweep.contended": "other processes used 45% of the host's CPU"}
    c = compare.build("busy", [quiet, contended])
    assert c.speedup_intervals[1] is None and c.fastest == 0
    header, rows = compare.table(c)
    assert rows[1][header.index("speedup")] == "busy machine"
    text = "\n".join(compare.verdict(c))
    assert (
        "#1 p1 against the baseline: not compared, measured under different load (#1: other processes used 45% "
        "of the host's CPU)." in text
    )
    assert "0.59x" not in text and c.pareto == {0, 1}  # neither beats the other on a speed not compared
    assert "Fastest: not named: #1 p1 measured on a busy machine" in text
    # A busy baseline: nothing is compared with it.
    busy_base = compare.build("busy baseline", [contended, quiet])
    assert busy_base.speedups == [None, None] and "Fastest: not named: #1 p1" in "\n".join(compare.verdict(busy_base))
    header, rows = compare.table(busy_base)
    assert [row[header.index("speedup")] for row in rows] == ["baseline", "busy machine"]
    # The same numbers measured on a quiet machine keep their verdict.
    contended.tags = {}
    assert "#1 p1 against the baseline: 0.59x" in "\n".join(compare.verdict(compare.build("quiet", [quiet, contended])))


def test_the_terminal_table_fits_its_width():
    reason = "device=cuda: no NVIDIA GPU is visible to this job; accepted here: auto, cpu"
    lines = align(["#", "precision", "reason"], [["0", "fp32", reason], ["1", "bf16", ""]], width=40).splitlines()
    assert max(len(line) for line in lines) == 40 and lines[2] == "0  fp32       device=cuda: no NVIDIA GP…"
    assert lines[3] == "1  bf16"
    # Where not even the last column's header fits, the column is left out.
    narrow = align(["#", "precision", "reason"], [["0", "fp32", reason]], width=16).splitlines()
    assert narrow == ["#  precision", "-  ---------", "0  fp32"]
    # The column left last is cut in its turn where it still passes the width (a Pareto tie with two runs).
    tied = align(["#", "Pareto", "top finding"], [["0", "yes (tie: #1, #3)", reason]], width=14).splitlines()
    assert tied == ["#  Pareto", "-  -----------", "0  yes (tie: …"]
    assert align(["#", "reason"], [["0", reason]]).splitlines()[2] == f"0  {reason}"  # no width: whole
