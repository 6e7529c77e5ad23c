"""A run's log file that cannot be written (its directory gone, full or read-only) never raises into
the code that logged the line; the line still reaches the console."""

from __future__ import annotations

import io
import logging
import shutil

import pytest
from omegaconf import OmegaConf

from ghsweep.launch.log_file import RunLogFile
from tests.support.compose import compose_config


@pytest.fixture
def quiet_handler_errors(monkeypatch):
    monkeypatch.setattr(logging, "raiseExceptions", False)  # as python -m ghsweep runs


@pytest.mark.parametrize("handler_class", [logging.FileHandler, RunLogFile])
def test_a_line_after_the_run_directory_is_gone_reaches_the_console_only(tmp_path, handler_class, quiet_handler_errors):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_file = handler_class(run_dir / "ghsweep.log")
    log_file.close()  # as Hydra closes it when it sets up the next job's logging
    shutil.rmtree(run_dir)
    console = io.StringIO()
    logger = logging.getLogger(f"test_log_file.{handler_class.__name__}")
    logger.propagate = False
    logger.handlers = [logging.StreamHandler(console), log_file]
    try:
        if handler_class is logging.FileHandler:  # why RunLogFile exists: Python's raises here
            with pytest.raises(OSError):
                logger.error("the MLflow record is incomplete")
        else:
            logger.error("the MLflow record is incomplete")
        assert console.getvalue().count("the MLflow record is incomplete") == 1
    finally:
        logger.handlers = []


def test_the_runs_log_file_is_written_through_it():
    handlers = OmegaConf.to_container(compose_config(hydra=True).hydra.job_logging.handlers, resolve=False)
    assert handlers["file"]["class"] == "ghsweep.launch.log_file.RunLogFile"
    assert handlers["file"]["filename"] == "${hydra.runtime.output_dir}/${hydra.job.name}.log"
