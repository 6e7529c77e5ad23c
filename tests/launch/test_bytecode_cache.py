"""Where Python keeps no bytecode, a sweep's processes keep theirs in the user cache, never beside the
sources; elsewhere, and where the user chose a prefix, nothing changes."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.types import RunMode

from ghsweep.launch import bytecode_cache
from ghsweep.launch.bytecode_cache import NO_BYTECODE_ENV, PREFIX_ENV, keep_bytecode
from ghsweep.launch.local_gpus import ONE_AT_A_TIME_LAUNCHER
from ghsweep.launch.warm_worker_client import PreimportedWorkerCallback
from tests.support.compose import compose_config
from tests.support.paths import REPO


def _module(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.py"
    source.write_text(f"NAME = {name!r}\n")
    return source


@pytest.fixture
def no_bytecode(monkeypatch, tmp_path):
    """A Python that keeps no bytecode of its libraries: PYTHONDONTWRITEBYTECODE set and the probed
    library (a module of tmp_path's) without bytecode beside it, its user cache under tmp_path; what
    keep_bytecode changes is put back after the test. The folder the bytecode would go to."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(NO_BYTECODE_ENV, "1")
    monkeypatch.delenv(PREFIX_ENV, raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    library = _module(tmp_path / "site", "probe_library")
    monkeypatch.syspath_prepend(str(library.parent))
    monkeypatch.setattr(bytecode_cache, "PROBE", "probe_library")
    return tmp_path / "cache" / "ghsweep" / "pycache"


def test_a_python_that_writes_no_bytecode_keeps_it_in_the_user_cache(no_bytecode, tmp_path, monkeypatch, capsys):
    assert keep_bytecode(True) == no_bytecode
    assert (sys.pycache_prefix, sys.dont_write_bytecode) == (str(no_bytecode), False)
    assert os.environ[PREFIX_ENV] == str(no_bytecode) and NO_BYTECODE_ENV not in os.environ  # what jobs inherit
    assert "worker.bytecode_cache=false" in capsys.readouterr().out
    # This process's next import writes its bytecode there, and nothing beside the source.
    source = _module(tmp_path / "src", "imported_after")
    monkeypatch.syspath_prepend(str(source.parent))
    importlib.import_module("imported_after")
    written = list(no_bytecode.rglob("imported_after.*.pyc"))
    assert len(written) == 1 and str(source.parent.resolve()) in str(written[0])
    assert not (source.parent / "__pycache__").exists()


def test_nothing_changes_when_switched_off_or_the_user_chose_a_prefix(no_bytecode, tmp_path, monkeypatch):
    assert keep_bytecode(False) is None
    assert sys.dont_write_bytecode and os.environ[NO_BYTECODE_ENV] == "1" and PREFIX_ENV not in os.environ
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "theirs"))
    assert keep_bytecode(True) is None and PREFIX_ENV not in os.environ


def test_a_python_whose_libraries_have_their_bytecode_is_left_alone(no_bytecode, tmp_path):
    # pip writes it as it installs: read whatever PYTHONDONTWRITEBYTECODE says, nothing to keep.
    library = tmp_path / "site" / "probe_library.py"
    py_compile.compile(str(library), cfile=importlib.util.cache_from_source(str(library)))
    assert not bytecode_cache.keeps_no_bytecode() and keep_bytecode(True) is None
    assert PREFIX_ENV not in os.environ and os.environ[NO_BYTECODE_ENV] == "1"


def test_the_knob_reaches_the_first_callback_hydra_makes(no_bytecode):
    callbacks = compose_config("worker.bytecode_cache=false", hydra=True).hydra.callbacks
    assert callbacks.preimported_worker.bytecode_cache is False
    PreimportedWorkerCallback(RunMode.RUN, ONE_AT_A_TIME_LAUNCHER, True, False, bytecode_cache=False)
    assert sys.dont_write_bytecode and PREFIX_ENV not in os.environ
    PreimportedWorkerCallback(RunMode.RUN, ONE_AT_A_TIME_LAUNCHER, True, dry_run=True)  # a dry run runs nothing
    assert PREFIX_ENV not in os.environ
    PreimportedWorkerCallback(RunMode.RUN, ONE_AT_A_TIME_LAUNCHER, True, False)  # the default
    assert os.environ[PREFIX_ENV] == str(no_bytecode)


def test_the_processes_a_sweep_starts_write_their_bytecode_there(tmp_path):
    # A process like the sweep's turns the cache on and starts a job, both import a module each: both
    # modules' bytecode is in the cache, none beside their sources.
    sources = [_module(tmp_path / "src", "in_the_sweep"), _module(tmp_path / "src", "in_its_job")]
    sweep = (
        "import subprocess, sys\n"
        "from ghsweep.launch import bytecode_cache\n"
        "bytecode_cache.PROBE = 'in_its_job'\n"  # a library shipped without bytecode
        "bytecode_cache.keep_bytecode(True)\n"
        "import in_the_sweep\n"
        "subprocess.run([sys.executable, '-c', 'import in_its_job'], check=True)\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path / "src"), str(REPO)]),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        **{NO_BYTECODE_ENV: "1"},
    )
    env.pop(PREFIX_ENV, None)
    done = subprocess.run([sys.executable, "-c", sweep], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cache = tmp_path / "cache" / "ghsweep" / "pycache"
    for source in sources:
        assert len(list(cache.rglob(f"{source.stem}.*.pyc"))) == 1, source
    assert not (tmp_path / "src" / "__pycache__").exists()
