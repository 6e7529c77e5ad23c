import json

from ghsweep.core.run_result import RunResult, RunStatus


def test_result_json_holds_the_plain_status_name_and_loads_it_back_typed(tmp_path):
    RunResult("run", str(tmp_path), ["precision=bf16"], RunStatus.KILLED, error="stopped").save()
    raw = json.loads((tmp_path / "result.json").read_text())
    assert raw["status"] == "KILLED" and type(raw["status"]) is str
    loaded = RunResult.load(tmp_path)
    assert loaded.status is RunStatus.KILLED
    assert f"{loaded.status}" == str(loaded.status) == "KILLED"  # as MLflow tags and reports show it
