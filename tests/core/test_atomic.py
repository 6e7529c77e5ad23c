import stat

import pytest

from ghsweep.core.atomic import write_atomic


def test_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("old")
    write_atomic(path, "new", mode=0o644)
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_without_a_mode_the_file_is_the_users_only(tmp_path):
    path = tmp_path / "config.yaml"
    write_atomic(path, "secret: x")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_last_complete_file(tmp_path):
    path = tmp_path / "run_plan.json"
    path.write_text("complete")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "cut \ud800 here")  # a lone surrogate: no encoding can write it
    assert path.read_text() == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["run_plan.json"]
