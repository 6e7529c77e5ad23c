"""What a run's identity holds beyond its config (launch.provenance): the code's commit and whether
it was edited, on a real git checkout, and the input files' contents, hashed once per size and mtime."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ghsweep.launch import provenance
from ghsweep.launch.provenance import checkout_commit, input_digests
from ghsweep.launch.resume import run_hash
from tests.support.compose import compose_config


def git(checkout: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(checkout), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_the_commit_and_each_edit_of_the_package_are_told_apart(tmp_path):
    assert checkout_commit(tmp_path) is None  # not a checkout: the version alone names the code
    (tmp_path / "ghsweep").mkdir()
    (tmp_path / "ghsweep" / "train.py").write_text("STEP = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    clean = checkout_commit(tmp_path)
    assert clean == f"commit {git(tmp_path, 'rev-parse', 'HEAD')[:12]}"
    (tmp_path / "README.md").write_text("other docs\n")  # not the package: the same code
    assert checkout_commit(tmp_path) == clean
    (tmp_path / "ghsweep" / "train.py").write_text("STEP = 2\n")
    edited = checkout_commit(tmp_path)
    assert edited is not None and edited.startswith(f"{clean}+dirty.")
    (tmp_path / "ghsweep" / "train.py").write_text("STEP = 3\n")
    assert checkout_commit(tmp_path) not in (clean, edited)  # another edit, another identity
    git(tmp_path, "commit", "-qam", "second")
    assert checkout_commit(tmp_path) == f"commit {git(tmp_path, 'rev-parse', 'HEAD')[:12]}" != clean


@pytest.mark.cli  # run_hash asks git for the checkout's commit
def test_new_data_under_the_same_path_is_another_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = tmp_path / "dolly.jsonl"
    data.write_text('{"instruction": "a", "context": "", "response": "b", "category": "qa"}\n')
    cfg = compose_config("experiment=smoke", "data=dolly_file", f"data.path={data}")
    first = run_hash(cfg)
    os.utime(data, ns=(1, 1))  # touched, same content: the same run (hashed again, same digest)
    assert run_hash(cfg) == first
    data.write_text('{"instruction": "c", "context": "", "response": "d", "category": "qa"}\n')
    assert run_hash(cfg) != first
    cache = json.loads((tmp_path / "cache" / "ghsweep" / "file_digests.json").read_text())
    assert list(cache) == [str(data.resolve())]  # one entry a path: the latest size, mtime and digest
    assert input_digests(cfg) == {"data.path": "sha256:" + cache[str(data.resolve())][2]}


def test_a_model_folder_is_hashed_by_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "weights.bin").write_bytes(b"\0" * 10)
    cfg = compose_config("experiment=smoke", f"model.path={folder}")
    before = input_digests(cfg)["model.path"]
    (folder / "sub" / "weights.bin").write_bytes(b"\1" * 10)
    assert input_digests(cfg)["model.path"] != before
    assert input_digests(compose_config("experiment=smoke", f"model.path={tmp_path / 'none'}")) == {
        "model.path": "missing"
    }


@pytest.mark.cli  # the sweep's side asks git for the checkout's commit
def test_a_job_records_the_code_its_sweep_looked_up(monkeypatch):
    """A SLURM node or container without git (or the checkout's .git) reads the sweep's code identity
    from its environment, so the job records what the launcher searched for."""
    monkeypatch.delenv(provenance.CODE_ENV, raising=False)
    provenance.code_version.cache_clear()
    here = provenance.code_version()
    provenance.hand_code_version_to_jobs()
    assert os.environ[provenance.CODE_ENV] == here
    monkeypatch.setenv(provenance.CODE_ENV, "ghsweep 0.1.0 commit 0123456789ab")
    provenance.code_version.cache_clear()
    assert provenance.code_version() == "ghsweep 0.1.0 commit 0123456789ab"
    provenance.code_version.cache_clear()
