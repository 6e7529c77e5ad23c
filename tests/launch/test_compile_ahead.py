"""worker.compile_ahead: the configurations a sweep compiles ahead, how their workers train, and a CPU
sweep whose later combination finds every graph compiled (ghsweep.launch.compile_ahead)."""

from __future__ import annotations

import json

import pytest

from ghsweep.config.validate import validate
from ghsweep.core.gpu import probe_gpu
from ghsweep.core.run_dir import SUMMARY, WORKER_LOG
from ghsweep.launch import compile_ahead
from ghsweep.launch.compile_ahead import ahead_config, compiled_mark, configurations, graph_key, run_config
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.models import UNREADABLE_WEIGHTS_ERROR, unreadable_model

SMOKE_COMPILED = ("experiment=smoke", "train.compile=true")


def sweep(*combinations: tuple[str, ...]) -> list:
    """The launcher's composed combinations (with their `hydra` node) of a sweep."""
    return [compose_config(*SMOKE_COMPILED, *overrides, hydra=True) for overrides in combinations]


def test_each_configuration_the_first_does_not_share_is_compiled_once():
    composed = sweep(
        ("precision=fp32", "offload=off"),
        ("precision=fp32", "offload=on"),  # the first's graphs: offload wraps the layers, not what they compile
        ("precision=bf16", "offload=off"),
        ("precision=bf16", "offload=on"),
        ("precision=bf16", "offload=off", "peft=none"),
    )
    ahead = configurations(composed)
    assert [(c.precision.name, c.peft.name) for c in ahead] == [("bf16", "lora"), ("bf16", "none")]
    assert graph_key(run_config(composed[2])) == graph_key(run_config(composed[3]))


def test_a_configuration_compiled_ahead_into_the_cache_before_is_not_compiled_again(tmp_path):
    cache = f"train.compile_cache_dir={tmp_path / 'cache'}"
    composed = sweep(("precision=fp32", cache), ("precision=bf16", cache))
    assert [c.precision.name for c in configurations(composed)] == ["bf16"]
    mark = compiled_mark(run_config(composed[1]), probe_gpu())
    assert mark is not None and mark.parent == tmp_path / "cache"
    mark.parent.mkdir()
    mark.touch()
    assert configurations(composed) == []
    other_cache = sweep(("precision=fp32",), ("precision=bf16", f"train.compile_cache_dir={tmp_path / 'other'}"))
    assert [c.precision.name for c in configurations(other_cache)] == ["bf16"]
    assert compiled_mark(run_config(compose_config(*SMOKE_COMPILED, "train.compile_cache_dir=null")), None) is None


def test_nothing_is_compiled_ahead_where_nothing_compiles_or_one_run_has_several_ranks():
    on_cpu = [compose_config("experiment=smoke", f"precision={p}", hydra=True) for p in ("fp32", "bf16")]
    assert configurations(on_cpu) == []  # train.compile=auto compiles on a GPU only
    two_ranks = sweep(("precision=fp32",), ("precision=bf16", "backend.gpus_per_node=2"))
    assert configurations(two_ranks) == []


def test_a_compile_ahead_worker_trains_two_layers_two_steps_unprofiled_without_offload():
    cfg = run_config(compose_config(*SMOKE_COMPILED, "precision=bf16", "offload=on", "profile=torch", hydra=True))
    ahead = ahead_config(cfg)
    assert (ahead.model.num_layers, ahead.train.max_steps, ahead.train.measure) == (2, 2, False)
    assert ahead.profile.name == "none" and ahead.offload.enabled is False
    assert graph_key(ahead) != graph_key(cfg)  # only the depth: the layer and its shapes are the same
    assert ahead.precision == cfg.precision and ahead.train.seq_length == cfg.train.seq_length
    validate(ahead, None)  # a config the worker accepts
    assert cfg.model.num_layers == 4 and cfg.offload.enabled is True  # the combination's own is untouched


def test_a_compile_ahead_that_cannot_start_is_said_in_one_line(tmp_path, caplog):
    cfg = run_config(compose_config(*SMOKE_COMPILED, "precision=bf16", "model.hidden_size=0", hydra=True))
    with caplog.at_level("INFO", logger=compile_ahead.__name__):
        compile_ahead.compile_all([cfg], tmp_path / compile_ahead.FOLDER)
    said = caplog.text
    assert "compiling ahead for precision=bf16 peft=lora failed (ConfigError: model.hidden_size=0" in said
    assert "its combinations compile for themselves" in said
    assert not (tmp_path / compile_ahead.FOLDER).exists()


@pytest.mark.cli  # the worker is a process of its own
def test_a_failing_compile_ahead_worker_leaves_its_log_and_the_sweep_goes_on(tmp_path, caplog):
    model = unreadable_model(tmp_path / "model")
    cfg = run_config(compose_config(*SMOKE_COMPILED, "precision=bf16", f"model.path={model}", hydra=True))
    with caplog.at_level("INFO", logger=compile_ahead.__name__):
        compile_ahead.compile_all([cfg], tmp_path / compile_ahead.FOLDER)
    log_file = tmp_path / compile_ahead.FOLDER / "0" / WORKER_LOG
    assert f"compiling ahead for precision=bf16 peft=lora failed (exit 1; log: {log_file})" in caplog.text
    assert UNREADABLE_WEIGHTS_ERROR.split(":")[0] in log_file.read_text()
    assert "compiled ahead in" in caplog.text


def test_a_later_configuration_finds_every_graph_compiled_ahead(tmp_path):
    """A CPU sweep of an uncompiled combination, then a compiled one, with worker.compile_ahead=true: the
    second's graphs are compiled beside the first (on a two-layer model), so its own run compiles nothing.
    (The first is left uncompiled only to keep the test short: two compiles on 2 cores took 132 s in CI.)"""
    args = [
        "-m",
        "experiment=smoke",
        "precision=fp32",
        "train.compile=false,true",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "worker.compile_ahead=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "compiling 1 more configuration(s) ahead" in output
    assert "compiled ahead for precision=fp32 peft=lora: " in output
    eager, compiled = (json.loads((tmp_path / "sweep" / n / SUMMARY).read_text())["info"] for n in ("0", "1"))
    assert eager["compiled"] is False and compiled["compiled"] is True
    assert compiled["compile_fxgraph_cache_hits"] > 0 and compiled.get("compile_fxgraph_cache_misses", 0) == 0
    assert not (tmp_path / "sweep" / compile_ahead.FOLDER).exists()
    # A later sweep on this cache (the default train.compile_cache_dir, beside the sweeps) starts no worker for it.
    assert list((tmp_path / "multirun" / "compile_cache").glob("compiled-ahead-*"))
