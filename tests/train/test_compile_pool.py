"""Inductor's compile pool and a run that nsys records: the worker compiles in its own process unless
TORCHINDUCTOR_COMPILE_THREADS asks for a pool, and a worker whose collection is handed to it ends
the pool it has before it exits, rather than leave it to be killed while nsys writes the report."""

from __future__ import annotations

import pytest
import torch._inductor.config as inductor_config
from torch._inductor.async_compile import AsyncCompile, _pool_set

from ghsweep.train.phases import HandedCollection
from ghsweep.train.torch_train import compile_in_this_process


def test_a_worker_under_nsys_compiles_in_its_own_process(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setattr(inductor_config, "compile_threads", 8)
    compile_in_this_process()
    assert inductor_config.compile_threads == 1
    assert not AsyncCompile.use_process_pool()  # what Inductor asks before it hands a kernel to its pool


def test_compile_threads_the_user_set_are_kept(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")
    monkeypatch.setattr(inductor_config, "compile_threads", 4)
    compile_in_this_process()
    assert inductor_config.compile_threads == 4


@pytest.mark.cli  # the compile pool is processes
def test_a_handed_worker_ends_its_compile_pool_before_it_exits(monkeypatch, tmp_path):
    monkeypatch.setattr(inductor_config, "compile_threads", 2)
    pool = AsyncCompile.process_pool()
    sidecar = pool.process  # the pool's own process, which starts its compile workers
    assert sidecar.poll() is None
    HandedCollection(tmp_path).end_own_processes()
    assert sidecar.poll() is not None  # it exited: nothing of the pool is left to be killed
    assert pool not in _pool_set
