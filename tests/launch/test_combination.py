"""One combination as Hydra composed it, read from its config's `hydra` node: the submitit launcher
reads it before it submits the job, the job as Hydra runs it."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.run_result import RunStatus
from ghsweep.launch.combination import Combination, run_name
from tests.support.compose import compose_config


def test_a_combination_is_read_from_the_hydra_node_with_its_secrets_redacted(tmp_path):
    overrides = ["precision=bf16", "+model.hf_token=hf_s3cr3t_value", "+hydra.launcher.retries=2"]
    cfg = compose_config("hydra/launcher=submitit_local", *overrides, hydra=True)
    task = list(cfg.hydra.overrides.task)
    combo = Combination.of(cfg.hydra, tmp_path, task, in_sweep=False)
    assert combo.overrides == ["precision=bf16", "+model.hf_token=***"]
    assert "hf_s3cr3t_value" not in combo.name and combo.name.startswith("+model.hf_token=")
    assert (combo.num, combo.in_sweep, combo.run_dir) == (0, False, tmp_path)
    assert combo.choices["precision"] == "bf16" and "hydra/launcher" not in combo.choices
    assert (combo.launcher, combo.retries, combo.cwd) == ("submitit_local", 2, str(Path.cwd()))
    result = combo.result(RunStatus.DRY_RUN)
    assert (result.name, result.run_dir, result.overrides) == (combo.name, str(tmp_path), combo.overrides)


def test_its_mlflow_run_is_named_by_the_knobs_its_sweep_varies(tmp_path):
    cfg = compose_config("experiment=smoke", "precision=bf16", "offload=on", "+model.hf_token=hf_s3cr3t", hydra=True)
    overrides = ["experiment=smoke", "precision=bf16", "offload=on", "+model.hf_token=hf_s3cr3t"]
    combo = Combination.of(cfg.hydra, tmp_path, overrides, in_sweep=False)
    sweep = "python -m ghsweep -m experiment=smoke precision=fp32,bf16 'offload=glob(*)' '+model.hf_token=***'"
    assert run_name(combo, sweep) == "precision=bf16 offload=on"
    # A preset's own sweep (hydra.sweeper.params) varies knobs the command does not name.
    assert run_name(combo, "python -m ghsweep -m experiment=smoke") == "precision=bf16 offload=on +model.hf_token=***"
    assert run_name(combo, None) == combo.name  # a single run: its overrides
