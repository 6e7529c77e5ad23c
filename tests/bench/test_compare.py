"""`python -m ghsweep.bench --compare KEY=A,B --repeats N`: which processes it runs, in which order, and how
it compares the values (no GPU: the rows' results are given)."""

from __future__ import annotations

import pytest

from ghsweep.bench.__main__ import comparison, format_comparison, main, plan_runs, report_parts


def test_each_row_runs_with_each_value_in_turn_every_round():
    runs = plan_runs(["ours_lora_bf16", "ours_lora_fp8"], ["train.seed=3"], "peft.adapter_scale=output,weight", 2)
    assert [(r.row, r.value) for r in runs] == [
        ("ours_lora_bf16", "output"),
        ("ours_lora_bf16", "weight"),
        ("ours_lora_fp8", "output"),
        ("ours_lora_fp8", "weight"),
    ] * 2
    assert runs[1].overrides == ["train.seed=3", "peft.adapter_scale=weight"]
    assert len({r.label for r in runs}) == len(runs)


def test_without_compare_each_row_runs_once_as_named():
    runs = plan_runs(["usual_full_compiled", "ours_full_bf16"], ["train.seed=3"], None, 1)
    assert [(r.label, r.overrides, r.value) for r in runs] == [
        ("usual_full_compiled", ["train.seed=3"], None),
        ("ours_full_bf16", ["train.seed=3"], None),
    ]


@pytest.mark.parametrize(
    "compare,rows,said",
    [
        ("peft.adapter_scale=weight", ["ours_lora_bf16"], "two values or more"),
        ("=a,b", ["ours_lora_bf16"], "expected KEY=A,B"),
        ("peft.adapter_scale=output,weight", ["usual_lora_bf16_compiled"], "usual_lora_bf16_compiled"),
    ],
)
def test_a_comparison_that_cannot_run_says_why(compare, rows, said):
    with pytest.raises(ValueError, match=said):
        plan_runs(rows, [], compare, 1)


def test_the_command_line_refuses_repeats_without_a_comparison(capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "ours_lora_bf16", "--repeats", "2"])
    assert "--repeats 2" in capsys.readouterr().err


def row(step_ms: float, peak: float = 29.4) -> dict:
    return {"ok": True, "step_time_ms": step_ms, "tokens_per_s": 4096 / step_ms * 1000, "peak_mem_gb": peak}


def test_each_value_is_its_rounds_mean_against_the_first_value_and_a_failed_round_is_counted():
    runs = plan_runs(["ours_lora_bf16"], [], "peft.adapter_scale=output,weight", 2)
    measured = [row(216.0), row(212.0, 29.5), row(218.0), {"ok": False, "error": "OOM"}]
    results = {run.label: result for run, result in zip(runs, measured)}
    output, weight = comparison(runs, results)
    assert output == {
        "row": "ours_lora_bf16",
        "value": "output",
        "step_time_ms": [216.0, 218.0],
        "mean_step_time_ms": 217.0,
        "vs_first": 1.0,
        "peak_mem_gb": 29.4,
        "failed": 0,
    }
    assert weight["step_time_ms"] == [212.0] and weight["failed"] == 1
    assert weight["vs_first"] == pytest.approx(212.0 / 217.0)
    table = format_comparison("peft.adapter_scale", [output, weight])
    assert "212.0 (1 failed)" in table and "0.977" in table


def test_the_targets_are_checked_on_each_values_first_round():
    runs = plan_runs(["ours_lora_bf16"], [], "peft.adapter_scale=output,weight", 2)
    measured = [row(216.0), row(200.0), row(210.0), row(205.0)]
    parts = report_parts(runs, {run.label: result for run, result in zip(runs, measured)})
    (output_check,) = parts["targets_by_value"]["output"]
    (weight_check,) = parts["targets_by_value"]["weight"]
    assert output_check["target"] == weight_check["target"] == "LoRA bf16 tokens/s >= 20,000"
    assert output_check["value"] == pytest.approx(4096 / 216.0 * 1000) and output_check["met"] is False
    assert weight_check["value"] == pytest.approx(4096 / 200.0 * 1000) and weight_check["met"] is True
