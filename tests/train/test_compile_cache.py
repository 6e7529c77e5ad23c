"""torch.compile's caches live in train.compile_cache_dir, one folder per torch, Triton and device:
a worker loads what another worker compiled, whatever cache its own machine has."""

from __future__ import annotations

import json
import os

import pytest

from ghsweep.config.validate import validate
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo
from ghsweep.core.run_dir import SUMMARY
from ghsweep.train.compile_cache import ENV, cache_key, use_compile_cache
from tests.support.cli import run_cli
from tests.support.compose import compose_config

H200 = GpuInfo("NVIDIA H200", (9, 0), 139.8, 139.0)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 79.2, 79.0)


def test_the_cache_folder_is_keyed_by_torch_triton_and_device(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(ENV, raising=False)
    h200 = use_compile_cache(str(tmp_path / "cache"), H200)
    assert h200 is not None and h200.name == cache_key(H200) and "sm90" in h200.name
    assert h200.is_dir() and str(h200) == os.environ[ENV]
    assert capsys.readouterr().err == ""  # the first key: nothing else there to ignore
    assert cache_key(A100) != cache_key(H200) != cache_key(None)
    use_compile_cache(str(tmp_path / "cache"), A100)
    said = capsys.readouterr().err
    assert "are not used" in said and cache_key(H200) in said and cache_key(A100) in said
    use_compile_cache(str(tmp_path / "cache"), A100)  # said once: the worker that started the key
    assert capsys.readouterr().err == ""


def test_no_folder_leaves_the_environment_alone(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "machine"))
    assert use_compile_cache(None, H200) is None
    assert os.environ[ENV] == str(tmp_path / "machine")


@pytest.mark.parametrize("folder", ["''", "a_file"])
def test_a_cache_dir_that_is_no_folder_is_refused(monkeypatch, tmp_path, folder):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match=r"^train.compile_cache_dir=.*: not a folder; accepted: a folder"):
        validate(compose_config("experiment=smoke", f"train.compile_cache_dir={folder}"), None)


def test_a_later_combination_and_another_node_load_what_the_first_compiled(tmp_path):
    """A sweep of two combinations on one "node" (the second forked from the pre-imported worker),
    then a run on another with its own machine cache (TORCHINDUCTOR_CACHE_DIR), sharing the launch
    directory's train.compile_cache_dir: only the first compiles."""
    steps = ["experiment=smoke", "train.compile=true", "train.max_steps=2", "train.warmup_steps=1"]
    runs = []
    for node, args in (
        ("node1", ["-m", "repeat=1,2", *steps, f"hydra.sweep.dir={tmp_path / 'sweep'}"]),
        ("node2", [*steps, f"hydra.run.dir={tmp_path / 'run'}"]),
    ):
        proc = run_cli(args, tmp_path, env={ENV: str(tmp_path / f"{node}-local")})
        assert proc.returncode == 0, proc.stderr[-3000:]
    for run_dir in (tmp_path / "sweep" / "0", tmp_path / "sweep" / "1", tmp_path / "run"):
        runs.append(json.loads((run_dir / SUMMARY).read_text())["info"])
    compiled = runs[0]["compile_fxgraph_cache_misses"]
    assert compiled > 0
    for later in runs[1:]:
        assert later["compile_fxgraph_cache_hits"] == compiled and later.get("compile_fxgraph_cache_misses", 0) == 0
    assert (tmp_path / "multirun" / "compile_cache" / cache_key(None)).is_dir()
