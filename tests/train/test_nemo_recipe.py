"""backend=nemo: every option of the config groups lands in NeMo's recipe, and NeMo accepts it.

Runs in the NeMo environment (tests/nemo/make_env.sh; CI: `.venv-nemo/bin/python -m pytest -m nemo`).
The model config is built with `apply_rope_fusion=False`: that fusion exists only with Transformer
Engine (the NeMo container has it); everything else is NeMo's and Megatron's own checking.
"""

from __future__ import annotations

import copy
import itertools
import json
import types
from pathlib import Path

import pytest
import torch

from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import RECIPE_JSON, RECIPE_TXT
from ghsweep.train import dolly_data as dolly
from ghsweep.train.flops import ModelShape
from ghsweep.train.nemo.recipe import (
    DATASET_DIR,
    build_recipe,
    check_config,
    load_recipe,
    model_shape,
    save_recipe,
)
from tests.support.nemo_recipes import nemo_typed, recipe_of
from tests.train.lr_schedule import assert_steps_the_torch_backend_s_rates

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]


def built_model_config(recipe):
    """Megatron's TransformerConfig built from the recipe: its __post_init__ is Megatron's validation."""
    import fiddle as fdl

    config = copy.deepcopy(recipe.model.config)
    config.apply_rope_fusion = False
    return fdl.build(config)


def nemo_validate(recipe) -> None:
    """NeMo's own check of a fine-tuning job (llm.api._validate_config) on the built recipe parts."""
    import fiddle as fdl
    from nemo.collections.llm import api

    parts = copy.deepcopy(recipe)
    parts.model.config.apply_rope_fusion = False
    # The strategy and parallel layout are what is checked; the accelerator only decides where it would run.
    parts.trainer.accelerator = "cpu"
    api._validate_config(
        fdl.build(parts.model), fdl.build(parts.data), fdl.build(parts.trainer), optim=fdl.build(parts.optim)
    )


def test_lora_maps_rank_alpha_dropout_and_fused_targets(tmp_path):
    recipe, _ = recipe_of(tmp_path, "peft=lora", "peft.r=8", "peft.alpha=16", "peft.dropout=0.1")
    assert type(recipe.peft).__name__ == "Config" and recipe.peft.__fn_or_cls__.__name__ == "LoRA"
    assert (recipe.peft.dim, recipe.peft.alpha, recipe.peft.dropout) == (8, 16, 0.1)
    assert recipe.peft.target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    recipe, _ = recipe_of(tmp_path, "peft=lora", "peft.target_modules=[q_proj,k_proj,v_proj,down_proj]")
    assert recipe.peft.target_modules == ["linear_qkv", "linear_fc2"]
    with pytest.raises(ConfigError, match=r"q_proj, k_proj, v_proj are one fused layer \(linear_qkv\)"):
        check_config(nemo_typed("peft.target_modules=[q_proj]"), runtime=False)


def test_full_fine_tuning_has_no_adapter_and_the_run_s_parallel_layout(tmp_path):
    from nemo.collections import llm

    recipe, _ = recipe_of(tmp_path, "peft=none")
    assert recipe.peft is None
    assert recipe.trainer.strategy.tensor_model_parallel_size == 1
    nemo_validate(recipe)
    # The recipe's own full fine-tuning layout (tensor parallel 2) is what NeMo refuses on one GPU.
    raw = llm.llama2_7b.finetune_recipe(dir=str(tmp_path), num_nodes=1, num_gpus_per_node=1, peft_scheme=None)
    raw.data = recipe.data
    with pytest.raises(AssertionError, match="divisible"):
        nemo_validate(raw)


@pytest.mark.parametrize(
    "overrides, precision, fp8, fp8_recipe",
    [
        (["precision=fp32"], "32", None, None),
        (["precision=fp16"], "16-mixed", None, None),
        (["precision=bf16"], "bf16-mixed", None, None),
        (["precision=fp8", "precision.scaling=delayed"], "bf16-mixed", "hybrid", "delayed"),
        (["precision=fp8", "precision.scaling=current", "precision.format=e4m3"], "bf16-mixed", "e4m3", "tensorwise"),
    ],
)
def test_precision_maps_to_the_megatron_plugin_and_matching_optimizer(tmp_path, overrides, precision, fp8, fp8_recipe):
    import fiddle as fdl

    recipe, config = recipe_of(tmp_path, *overrides)
    plugin = recipe.trainer.plugins
    assert plugin.precision == precision
    assert getattr(plugin, "fp8", None) == fp8
    if fp8_recipe:
        assert plugin.fp8_recipe == fp8_recipe
    if config.precision.name == "fp16":
        assert plugin.fp16_initial_loss_scale == config.precision.initial_loss_scale
    # NeMo's plugin asserts the optimizer's dtype flags match its own before training (it reads
    # them from the Megatron optimizer's config, the only part a namespace stands in for here).
    built = fdl.build(plugin)
    built.convert_optimizer(
        types.SimpleNamespace(mcore_optimizer=types.SimpleNamespace(config=fdl.build(recipe.optim.config)))
    )
    assert built.dtype_config.params_dtype == {"32": torch.float32, "16-mixed": torch.half}.get(
        precision, torch.bfloat16
    )


def test_offload_maps_to_megatron_activation_offloading(tmp_path):
    recipe, _ = recipe_of(tmp_path, "model=llama2_7b", "offload=on", "offload.num_layers=8")
    c = recipe.model.config
    assert (c.cpu_offloading, c.cpu_offloading_num_layers, c.cpu_offloading_activations, c.cpu_offloading_weights) == (
        True,
        8,
        True,
        False,
    )
    assert c.recompute_granularity is None and c.recompute_method is None and c.recompute_num_layers is None
    assert built_model_config(recipe).cpu_offloading_num_layers == 8
    off, _ = recipe_of(tmp_path, "model=llama2_7b", "offload=off")
    assert off.model.config.cpu_offloading is False and built_model_config(off).cpu_offloading is False


@pytest.mark.parametrize(
    "overrides, ours, megatrons",
    [
        (
            ["model=tiny_llama", "offload=on", "offload.num_layers=4"],
            r"offload.num_layers=4: .* accepted: 1 to 3",
            "CPU offloading can be done only for layers less than 4",
        ),
        (
            ["model=llama2_7b", "offload=on", "backend.recompute_granularity=selective"],
            r"backend.recompute_granularity=selective: Megatron refuses",
            "CPU offloading does not work when activation",
        ),
        (
            ["model=llama2_7b", "backend.recompute_granularity=full"],
            r"backend.recompute_method=None: .* accepted: block, uniform",
            'recompute_method must be "block" or "uniform"',
        ),
    ],
)
def test_impossible_combinations_are_refused_by_us_and_by_megatron(tmp_path, overrides, ours, megatrons):
    config = nemo_typed(*overrides)
    with pytest.raises(ConfigError, match=ours):
        check_config(config, runtime=False)
    with pytest.raises(ValueError, match=megatrons):
        built_model_config(build_recipe(config, tmp_path))


def test_memory_has_no_recipe_setting(tmp_path):
    # memory=unified is the worker's allocator, switched before CUDA starts; the recipe is unchanged.
    assert recipe_of(tmp_path, "memory=device")[0] == recipe_of(tmp_path, "memory=unified")[0]


@pytest.mark.parametrize("option, workers, pin, persistent", [("default", 2, True, True), ("sync", 0, False, False)])
def test_dataloader_options_reach_nemo_s_data_module(tmp_path, option, workers, pin, persistent):
    recipe, _ = recipe_of(tmp_path, f"dataloader={option}")
    d = recipe.data
    assert (d.num_workers, d.pin_memory, d.persistent_workers) == (workers, pin, persistent)
    with pytest.raises(ConfigError, match=r"dataloader.prefetch_factor=4: .* accepted with backend=nemo: null, 2"):
        check_config(nemo_typed(f"dataloader={option}", "dataloader.prefetch_factor=4"), runtime=False)


@pytest.mark.parametrize("model", ["tiny_llama", "llama2_7b"])
def test_model_shape_reaches_megatron(tmp_path, model):
    recipe, config = recipe_of(tmp_path, f"model={model}")
    built = built_model_config(recipe)
    m = config.model
    assert (
        built.num_layers,
        built.hidden_size,
        built.ffn_hidden_size,
        built.num_attention_heads,
        built.num_query_groups,
        built.vocab_size,
        built.layernorm_epsilon,
    ) == (
        m.num_layers,
        m.hidden_size,
        m.intermediate_size,
        m.num_attention_heads,
        m.num_key_value_heads,
        m.vocab_size,
        m.rms_norm_eps,
    )
    # Random init: nothing to restore, byte-level tokens.
    assert recipe.resume is None
    assert recipe.model.tokenizer.__fn_or_cls__.__name__ == "ByteLevelTokenizer"


def test_model_path_restores_the_imported_checkpoint_in_its_own_shape_with_its_tokenizer(tmp_path):
    from nemo.lightning.base import NEMO_MODELS_CACHE

    folder = tmp_path / "two-layer-llama"
    folder.mkdir()
    # A Llama that is not Llama-2-7B, as transformers >= 5 writes it (rope_theta inside rope_parameters).
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "max_position_embeddings": 4096,
                "hidden_size": 512,
                "intermediate_size": 1376,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "rms_norm_eps": 1e-6,
                "vocab_size": 1000,
                "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                "tie_word_embeddings": True,
            }
        )
    )
    recipe, config = recipe_of(tmp_path, "model=llama2_7b", f"model.path={folder}")
    assert recipe.resume.restore_config.path == str(Path(NEMO_MODELS_CACHE) / "two-layer-llama")
    assert recipe.model.tokenizer.pretrained_model_name == str(folder)
    c = recipe.model.config
    # The checkpoint's shape, not model=llama2_7b's.
    assert (c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.num_query_groups) == (
        2,
        512,
        1376,
        8,
        4,
    )
    assert (c.layernorm_epsilon, c.rotary_base, c.share_embeddings_and_output_weights) == (1e-6, 500000.0, True)
    assert model_shape(config.model) == ModelShape(512, 1376, 2, 8, 4, 1000)


def test_dolly_file_is_packed_by_nemo_s_own_data_module(tmp_path):
    import fiddle as fdl

    # Imported here: the worker module imports Lightning, which the base install (where this file is
    # collected but deselected) lacks.
    from ghsweep.train.nemo.nemo_train import VALIDATION_RECORDS, write_dataset

    records = dolly.synthetic_dolly(60, seed=3)
    dolly.write_dolly_jsonl(records, tmp_path / "dolly.jsonl")
    recipe, config = recipe_of(
        tmp_path, "data=dolly_file", f"data.path={tmp_path / 'dolly.jsonl'}", "train.seq_length=128"
    )
    assert recipe.data.dataset_root == str(tmp_path / DATASET_DIR)
    assert write_dataset(config, tmp_path / DATASET_DIR) == 60 - VALIDATION_RECORDS
    lines = (tmp_path / DATASET_DIR / "training.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first == {
        "input": dolly.prompt_text(records[VALIDATION_RECORDS]),
        "output": records[VALIDATION_RECORDS]["response"],
    }

    data = fdl.build(recipe.data)
    data.tokenizer = fdl.build(recipe.model.tokenizer)
    data.prepare_data()
    # micro_batch_size x seq_length tokens per packed micro-batch, as the torch backend's blocks.
    packed_length = config.train.micro_batch_size * config.train.seq_length
    assert data.train_path_packed.name == f"training_{packed_length}.npy" and data.train_path_packed.exists()


def test_train_settings_and_callbacks(tmp_path):
    recipe, config = recipe_of(
        tmp_path,
        "train.max_steps=12",
        "train.log_every=4",
        "train.lr=2e-4",
        "train.weight_decay=0.01",
        "train.grad_clip=0.5",
        "capture.start_step=2",
        "capture.num_steps=4",
    )
    t = recipe.trainer
    assert (t.max_steps, t.log_every_n_steps, t.limit_val_batches, t.enable_checkpointing) == (12, 4, 0, False)
    assert (recipe.optim.config.lr, recipe.optim.config.weight_decay, recipe.optim.config.clip_grad) == (
        2e-4,
        0.01,
        0.5,
    )
    assert recipe_of(tmp_path, "train.grad_clip=null")[0].optim.config.clip_grad == 0.0  # Megatron: no clipping
    assert recipe.optim.lr_scheduler.__fn_or_cls__.__name__ == "CosineAnnealingScheduler"
    by_name = {c.__fn_or_cls__.__name__: c for c in t.callbacks}
    # NsysCallback stops after its end_step's batch: steps 2, 3, 4, 5.
    assert (by_name["NsysCallback"].start_step, by_name["NsysCallback"].end_step) == (2, 5)
    metrics = by_name["StepMetricsCallback"]
    assert metrics.metrics_path == str(tmp_path / "metrics.jsonl")
    assert metrics.tokens_per_step == config.train.micro_batch_size * config.train.seq_length
    assert recipe.log.log_dir == str(tmp_path / "nemo")
    assert "GarbageCollectionCallback" not in by_name  # train.gc_interval=null: Python's own collections
    collected = recipe_of(tmp_path, "train.gc_interval=25")[0].trainer.callbacks
    gc_callback = next(c for c in collected if c.__fn_or_cls__.__name__ == "GarbageCollectionCallback")
    assert (gc_callback.gc_interval_train, gc_callback.gc_interval_val) == (25, 25)


def test_nemo_accepts_every_valid_combination(tmp_path):
    groups = {
        "peft": ["lora", "none"],
        "precision": ["fp32", "fp16", "bf16", "fp8"],
        "offload": ["off", "on"],
        "dataloader": ["default", "sync"],
    }
    # memory is left out: it changes no recipe field (test_memory_has_no_recipe_setting).
    for combo in itertools.product(*groups.values()):
        overrides = ["model=llama2_7b", *(f"{g}={o}" for g, o in zip(groups, combo))]
        recipe, _ = recipe_of(tmp_path, *overrides)
        nemo_validate(recipe)
        built_model_config(recipe)


def test_serialised_recipe_reloads(tmp_path):
    import fiddle as fdl

    recipe, _ = recipe_of(tmp_path, "model=llama2_7b", "peft=lora", "precision=fp8", "offload=on")
    text = save_recipe(recipe, tmp_path)
    assert (tmp_path / RECIPE_TXT).read_text().strip() == text.strip()
    assert text.startswith("<Partial[finetune(") and "cpu_offloading=True" in text
    reloaded = load_recipe(tmp_path)
    assert reloaded == recipe
    reloaded.model.config.apply_rope_fusion = False
    assert fdl.build(reloaded.model.config).cpu_offloading_num_layers == 4
    assert json.loads((tmp_path / RECIPE_JSON).read_text())  # plain JSON on disk


def test_every_rank_finds_the_packed_data_where_rank_0_writes_it(tmp_path):
    import fiddle as fdl

    recipe, _ = recipe_of(tmp_path)
    # Each rank builds the recipe in its own process: its own tokenizer object, the same files.
    ranks = [fdl.build(recipe.data) for _ in range(2)]
    for data in ranks:
        data.tokenizer = fdl.build(recipe.model.tokenizer)  # what llm.finetune hands the data module
    assert ranks[0].train_path_packed == ranks[1].train_path_packed
    assert ranks[0].train_path_packed.parent == tmp_path / "nemo_data" / "packed" / "byte_level"


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_nemo_s_scheduler_steps_the_torch_backend_s_rates(tmp_path, schedule):
    """NeMo's own scheduler, built from the recipe as its optimizer module builds it: the torch
    backend's warm-up exactly, the same peak and floor, the decay within one step of it."""
    import fiddle as fdl

    recipe, config = recipe_of(tmp_path, "train.max_steps=20", "train.lr=0.01", f"train.lr_schedule={schedule}")
    t = config.train
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=t.lr)
    scheduler = fdl.build(recipe.optim.lr_scheduler).scheduler(None, optimizer)["lr_scheduler"]["scheduler"]
    theirs = []
    for _ in range(t.max_steps):
        theirs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert_steps_the_torch_backend_s_rates(theirs, t)
