import json

from ghsweep.core.run_result import RunResult, RunStatus, sweep_results


def test_result_json_holds_the_plain_status_name_and_loads_it_back_typed(tmp_path):
    RunResult("run", str(tmp_path), ["precision=bf16"], RunStatus.KILLED, error="stopped").save()
    raw = json.loads((tmp_path / "result.json").read_text())
    assert raw["status"] == "KILLED" and type(raw["status"]) is str
    loaded = RunResult.load(tmp_path)
    assert loaded.status is RunStatus.KILLED
    assert f"{loaded.status}" == str(loaded.status) == "KILLED"  # as MLflow tags and reports show it


def test_a_sweep_s_results_come_in_job_order_with_their_directories(tmp_path):
    for name in ("10", "2", "custom"):
        (tmp_path / name).mkdir()
        RunResult(name, str(tmp_path / name), [f"repeat={name}"], RunStatus.FINISHED).save()
    (tmp_path / "3").mkdir()  # a run directory without a result (a job that never started) is left out
    found = sweep_results(tmp_path)
    assert [d.name for d, _ in found] == ["custom", "2", "10"]
    assert [r.overrides for _, r in found] == [["repeat=custom"], ["repeat=2"], ["repeat=10"]]
