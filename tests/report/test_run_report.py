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
