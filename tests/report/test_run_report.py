"""The run's own report (report.md in its run directory): where its time went."""

from __future__ import annotations

from omegaconf import OmegaConf

from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.report.run_report import write_run_report
from tests.support.compose import compose_config


def test_the_time_line_shows_the_parts_of_set_up_and_training_inside_them(tmp_path):
    timing = {"startup_s": 0.5, "setup_s": 0.6, "train_s": 15.0, "compile_s": 3.25, "capture_s": 7.5}
    timing |= {"device_s": 0.15, "model_s": 0.3, "data_s": 0.1, "optimizer_s": 0.05}
    timing |= {"worker_exit_s": 0.4, "analysis_s": 0.2, "record_s": 0.1, "wall_s": 16.8, "overhead_s": 1.8}
    result = RunResult("precision=bf16", str(tmp_path), ["precision=bf16"], RunStatus.FINISHED, timing=timing)
    asked = OmegaConf.to_container(compose_config("experiment=smoke"), resolve=True)
    write_run_report(result, asked, {}, tmp_path / "report.md")
    (time_line,) = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("Time:")]
    assert time_line == (
        "Time: 16.80 s in all (startup 0.50 s, setup 0.60 s (device 0.15 s, model 0.30 s, data 0.10 s, "
        "optimizer 0.05 s), train 15.00 s (compile 3.25 s, capture 7.50 s), "
        "worker_exit 0.40 s, analysis 0.20 s, record 0.10 s)."
    )


def test_the_knob_table_shows_what_was_asked_even_of_a_run_validation_refused(tmp_path):
    asked = OmegaConf.to_container(
        compose_config("experiment=smoke", "offload=on", "offload.num_layers=3"), resolve=True
    )
    result = RunResult("offload=on", str(tmp_path), ["offload=on"], RunStatus.FAILED, error="ConfigError: refused")
    write_run_report(result, asked, {"optimizer": "adamw_fused"}, tmp_path / "report.md")
    table = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| ")]
    assert table == [
        "| knob | value |",
        "| model | tiny_llama |",
        "| peft | lora |",
        "| precision | bf16 |",
        "| offload | on, 3 layers |",
        "| memory | device |",
        "| dataloader.num_workers | 2 |",
        "| optimizer | adamw_fused |",
        "| device | cpu |",
    ]


def gc_report(tmp_path, longest_ms: float, *overrides: str) -> list[str]:
    metrics = {"steps": 30.0, "steady_steps": 25.0, "warmup_steps_detected": 3.0, "excluded_steps": 2.0}
    metrics |= {"step_time_ms": 200.0, "gc_pause_ms_per_step": 1.234, "gc_pause_max_ms": longest_ms}
    metrics |= {"gc_full_collections": 2.0}
    result = RunResult("fp8", str(tmp_path), ["precision=fp8"], RunStatus.FINISHED, metrics=metrics)
    asked = OmegaConf.to_container(compose_config("experiment=smoke", *overrides), resolve=True)
    write_run_report(result, asked, {}, tmp_path / "report.md")
    lines = (tmp_path / "report.md").read_text().splitlines()
    steady = next(i for i, line in enumerate(lines) if line.startswith("Steady steps: 25"))
    return lines[steady + 1 : steady + 2]


def test_the_garbage_collector_s_pauses_are_said_under_the_steady_steps_with_the_lever(tmp_path):
    assert gc_report(tmp_path, 38.25, "train.gc_interval=50") == [
        "Python's garbage collector after the warm-up: 1.23 ms a step on average, the longest pause 38.2 ms "
        "(19.1% of the median step), 2 full collections, with train.gc_interval=50: its collections cost this; "
        "a larger interval, fewer of them."
    ]
    assert gc_report(tmp_path, 38.25) == [
        "Python's garbage collector after the warm-up: 1.23 ms a step on average, the longest pause 38.2 ms "
        "(19.1% of the median step), 2 full collections: train.gc_interval=50 collects at fixed steps instead "
        "(compare: train.gc_interval=null,50)."
    ]


def test_pauses_within_the_interval_the_run_measures_to_are_not_said(tmp_path):
    # 1.9 ms of a 200 ms step: under train.measure_ci_pct=1 (2 ms); said once the target is tighter.
    assert gc_report(tmp_path, 1.9) == [""]
    assert "garbage" not in (tmp_path / "report.md").read_text()
    assert gc_report(tmp_path, 1.9, "train.measure_ci_pct=0.5")[0].startswith("Python's garbage collector")
