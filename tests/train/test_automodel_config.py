"""backend=automodel: the config groups as AutoModel's recipe config, its refusals, and its dry run.

Plain data, no AutoModel: these run in the base environment (tests/train/test_automodel_recipe.py
checks the same config against AutoModel itself).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ghsweep.config.schema import ConfigSchema
from ghsweep.core.errors import ConfigError
from ghsweep.launch.run_planner import checked_config
from ghsweep.train.automodel.checks import check_config
from ghsweep.train.automodel.config import recipe_config
from tests.support.cli import run_cli
from tests.support.compose import compose_config, compose_typed


def automodel_config(*overrides: str) -> ConfigSchema:
    return compose_typed("backend=automodel", *overrides)


def test_lora_bf16_maps_onto_automodel_s_peft_model_and_loop(tmp_path):
    config = automodel_config(
        "model=llama2_7b",
        "peft.r=32",
        "peft.alpha=64",
        "train.seq_length=4096",
        "train.micro_batch_size=2",
        "train.max_steps=12",
        "dataloader=sync",
    )
    recipe = recipe_config(config, tmp_path, "cuda")
    assert recipe["peft"] == {
        "_target_": "nemo_automodel.components._peft.lora.PeftConfig",
        "dim": 32,
        "alpha": 64,
        "dropout": config.peft.dropout,
        "target_modules": [f"*.{m}" for m in config.peft.target_modules],
    }
    model = recipe["model"]
    assert model["_target_"] == "nemo_automodel.NeMoAutoModelForCausalLM.from_config"
    assert model["torch_dtype"] == "bfloat16" and model["attn_implementation"] == "flex_attention"
    assert {k: model["config"][k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size")} == {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 11008,
    }
    steps = recipe["step_scheduler"]
    assert steps["max_steps"] == 12 and steps["local_batch_size"] == steps["global_batch_size"] == 2
    assert steps["ckpt_every_steps"] > 12 and steps["val_every_steps"] > 12
    assert "gc_every_steps" not in steps  # train.gc_interval=null: Python's own collections
    assert (
        recipe_config(automodel_config("train.gc_interval=25"), tmp_path, "cuda")["step_scheduler"]["gc_every_steps"]
        == 25
    )
    assert recipe["dataloader"]["num_workers"] == 0 and recipe["dataloader"]["batch_size"] == 2
    assert recipe["dataset"] == {
        "_target_": "ghsweep.train.automodel.packed_dataset.packed_dolly",
        "run_dir": str(tmp_path),
    }
    assert recipe["optimizer"]["lr"] == config.train.lr and "fp8" not in recipe


def test_full_fine_tuning_fp8_and_a_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = automodel_config("peft=none", "precision=fp8", f"model.path={folder}", "data.packing_mask=causal")
    recipe = recipe_config(config, tmp_path, "cuda")
    assert "peft" not in recipe
    assert recipe["fp8"] == {"enabled": True, "recipe_name": "tensorwise", "filter_fqns": ["lm_head"], "emulate": False}
    assert recipe["model"]["_target_"] == "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained"
    assert recipe["model"]["pretrained_model_name_or_path"] == str(folder)
    assert recipe["model"]["attn_implementation"] == "sdpa"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["precision=fp16"],
            "precision=fp16: AutoModel trains in one dtype without loss scaling; accepted with "
            "backend=automodel: fp32, bf16, fp8",
        ),
        (["precision=fp8", "precision.library=te"], "precision.library=te:"),
        (["precision=fp8", "precision.scaling=delayed"], "precision.scaling=delayed:"),
        (["offload=on"], "offload=on: AutoModel offloads parameters and optimizer state"),
        (
            ["peft=none", "train.optimizer=adamw_sr"],
            "train.optimizer=adamw_sr: AutoModel's recipe here steps torch's AdamW; accepted with "
            "backend=automodel: auto, adamw",
        ),
    ],
)
def test_what_automodel_cannot_do_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_config(automodel_config(*overrides))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_dry_run_prints_the_recipe_config(tmp_path):
    proc = run_cli(["backend=automodel", "dry_run=true", "model=llama2_7b", "peft.r=8"], tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    text = proc.stdout.split("  recipe:  AutoModel TrainFinetuneRecipeForNextTokenPrediction, ", 1)[1]
    printed = yaml.safe_load("\n".join(line[4:] for line in text.splitlines()[1:] if line.startswith("    ")))
    assert printed["peft"]["dim"] == 8 and printed["model"]["config"]["num_hidden_layers"] == 32
    assert not list(Path(tmp_path).rglob("metrics.jsonl"))


def test_a_cpu_run_is_refused():
    # The plan's check, as the CLI makes it before any worker starts (a run the plan refuses, through the
    # CLI: test_profile_memory_is_refused_on_cpu_and_before_step_2 in tests/train/test_memory_record.py).
    cfg = compose_config("backend=automodel", "device=cpu", "train.max_steps=2", "profile=none")
    with pytest.raises(
        ConfigError,
        match=r"^backend=automodel: training needs an NVIDIA GPU \(FSDP2 over NCCL\) and this run has none "
        r"\(device=cpu\); accepted here: backend=torch$",
    ):
        checked_config(cfg, None)
