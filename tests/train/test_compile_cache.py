"""torch.compile's caches live in train.compile_cache_dir, one folder per torch, Triton and device:
a worker loads what another worker compiled, whatever cache its own machine has."""

from __future__ import annotations

import json

import pytest

from ghsweep.core.gpu import GpuInfo
from ghsweep.core.run_dir import SUMMARY
from ghsweep.train.compile_cache import ENV, cache_key, use_compile_cache
from tests.support.cli import run_cli

H200 = GpuInfo("NVIDIA H200", (9, 0), 139.8, 139.0)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 79.2, 79.0)


def test_the_cache_folder_is_keyed_by_torch_triton_and_device(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(ENV, raising=False)
    h200 = use_compile_cache(str(tmp_path / "cache"), H200)
    assert h200 is not None and h200.name == cache_key(H200) and "sm90" in h200.name
    assert h200.is_dir() and str(h200) == __import__("os").environ[ENV]
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
    assert __import__("os").environ[ENV] == str(tmp_path / "machine")


@pytest.mark.parametrize("folder", ["''", "a_file"])
def test_a_cache_dir_that_is_no_folder_is_refused(tmp_path, folder):
    (tmp_path / "a_file").write_text("")
    proc = run_cli(["experiment=smoke", f"train.compile_cache_dir={folder}", "dry_run=true"], tmp_path)
    assert proc.returncode != 0
    assert "train.compile_cache_dir=" in proc.stderr + proc.stdout and "not a folder" in proc.stderr + proc.stdout


def test_a_second_node_loads_what_the_first_compiled(tmp_path):
    """Two runs, each on a "node" with its own machine cache (TORCHINDUCTOR_CACHE_DIR), sharing the
    launch directory's train.compile_cache_dir: the second compiles nothing."""
    runs = {}
    for node in ("node1", "node2"):
        proc = run_cli(
            [
                "experiment=smoke",
                "train.compile=true",
                "train.max_steps=2",
                "train.warmup_steps=1",
                f"hydra.run.dir={tmp_path / node}",
            ],
            tmp_path,
            env={ENV: str(tmp_path / f"{node}-local")},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[node] = json.loads((tmp_path / node / SUMMARY).read_text())["info"]
    assert runs["node1"]["compile_fxgraph_cache_misses"] > 0
    assert runs["node2"]["compile_fxgraph_cache_hits"] == runs["node1"]["compile_fxgraph_cache_misses"]
    assert runs["node2"].get("compile_fxgraph_cache_misses", 0) == 0
    assert (tmp_path / "multirun" / "compile_cache" / cache_key(None)).is_dir()
    assert not any((tmp_path / "node2-local").glob("fxgraph"))
