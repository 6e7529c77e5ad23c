"""What the tune sweeper refuses before the sweep records anything (tune.check, through the CLI in
test_tune_sweeper): settings it cannot run with, a bound that is not a finite number, damaged storage."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from ghsweep.core.errors import TuneConfigError
from ghsweep.tune.settings import TuneSettings
from ghsweep.tune.study import storage_damage
from tests.support.paths import CONF_DIR


def settings(*overrides: str) -> TuneSettings:
    tune = OmegaConf.load(CONF_DIR / "hydra" / "sweeper" / "tune.yaml").tune
    tune.seed = 0
    return TuneSettings.from_config(OmegaConf.merge(tune, OmegaConf.from_dotlist(list(overrides))))


@pytest.mark.parametrize(
    "override, message",
    [
        ("trials=0", "tune.trials=0: must be a whole number >= 1"),
        ("parallel=0", "tune.parallel=0: must be a whole number >= 1"),
        ("objective=[]", "tune.objective=[]: one metric name (e.g. tokens_per_s) or two for a Pareto front"),
        ("max_peak_mem_gb=nan", "tune.max_peak_mem_gb=nan: must be a finite number"),
        ("max.step_time_ms=inf", "tune.max.step_time_ms=inf: must be a finite number"),
        ("min.mfu=-inf", "tune.min.mfu=-inf: must be a finite number"),
    ],
)
def test_settings_a_study_cannot_run_with_are_refused(override, message):
    with pytest.raises(TuneConfigError) as refused:
        settings(override)
    assert str(refused.value).startswith(message)


def test_a_finite_bound_is_a_constraint():
    assert [c.label for c in settings("max_peak_mem_gb=40").constraints] == ["peak_mem_gb<=40"]


def journal_of_one_trial(path: Path) -> None:
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(path))), study_name="s")
    study.tell(study.ask(), 1.0)


def test_a_good_journal_and_missing_storage_pass(tmp_path):
    journal_of_one_trial(tmp_path / "tune.journal")
    assert storage_damage("tune.journal", str(tmp_path)) is None
    assert storage_damage("new/tune.journal", str(tmp_path)) is None
    sqlite3.connect(tmp_path / "study.db").execute("CREATE TABLE t (x)").connection.commit()
    assert storage_damage("sqlite:///study.db", str(tmp_path)) is None
    assert storage_damage("sqlite:///missing.db", str(tmp_path)) is None


@pytest.mark.parametrize(
    "damage, storage, found",
    [
        (lambda p: p.write_bytes(b"\x8f\x00\xff random bytes\n\x01"), "tune.journal", "line 1 is not a JSON record"),
        (lambda p: p.write_bytes(p.read_bytes()[:-40]), "tune.journal", "is cut short (no end of line)"),
        (lambda p: p.write_text('{"op_code": 0}\n[1, 2]\n'), "tune.journal", "line 2 is not a record of an Optuna"),
        (lambda p: p.write_text("not a database"), "sqlite:///tune.journal", "is not an SQLite database"),
    ],
    ids=["random bytes", "cut mid-line", "not a journal record", "sqlite file not a database"],
)
def test_damaged_storage_is_one_line(tmp_path, damage, storage, found):
    path = tmp_path / "tune.journal"
    journal_of_one_trial(path)
    damage(path)
    line = storage_damage(storage, str(tmp_path))
    assert line is not None and line.startswith(f"tune.storage={storage}: {path} ") and found in line
    assert "restore it, or start a new study in another file" in line and "\n" not in line
