"""The recipe config backend=automodel writes, read by NeMo AutoModel's own config machinery.

Runs in the AutoModel environment (`bash tests/automodel/make_env.sh`, then
`.venv-automodel/bin/python -m pytest -m automodel`); no GPU: the typed sections AutoModel builds before
training (step scheduler, optimizer, dataloader, loss, LoRA, checkpointing) and the dataset it trains on.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ghsweep.config.schema import typed
from ghsweep.train.automodel.config import recipe_config, write_recipe
from ghsweep.train.dolly_data import IGNORE_INDEX
from tests.support.compose import compose_config
from tests.train.lr_schedule import assert_steps_the_torch_backend_s_rates

pytestmark = [pytest.mark.automodel, pytest.mark.usefixtures("automodel")]


def written_recipe(run_dir, *overrides: str):
    """A run directory as the job leaves it (config.yaml), and the worker's recipe YAML as AutoModel reads it."""
    from nemo_automodel.components.config.loader import load_yaml_config
    from nemo_automodel.recipes._typed_config import RecipeConfig

    composed = compose_config("backend=automodel", "train.seq_length=128", *overrides)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(composed, resolve=True))
    config = typed(composed)
    return config, RecipeConfig(load_yaml_config(str(write_recipe(recipe_config(config, run_dir, "cuda"), run_dir))))


def test_automodel_reads_the_loop_sections_as_ghsweep_set_them(tmp_path):
    config, recipe = written_recipe(tmp_path, "train.max_steps=7", "train.micro_batch_size=2", "train.lr=0.01")
    assert recipe.step_scheduler.max_steps == 7
    assert recipe.get("step_scheduler.local_batch_size") == recipe.step_scheduler.global_batch_size == 2
    assert recipe.checkpoint.enabled is False
    assert recipe.optimizer is not None and recipe.loss_fn is not None and recipe.dataloader is not None
    lora = recipe.peft.instantiate()
    assert (lora.dim, lora.alpha) == (config.peft.r, config.peft.alpha)
    # The adapters go where the torch backend's peft puts them: the named projections, not lm_head.
    from nemo_automodel.components._peft.module_matcher import ModuleMatcher
    from transformers import LlamaConfig, LlamaForCausalLM

    matcher = ModuleMatcher(target_modules=lora.target_modules)
    model = LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    )
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if matcher.match(module, name)}
    assert adapted == set(config.peft.target_modules)


def test_the_dataset_is_the_torch_backend_s_blocks_with_next_token_labels(tmp_path):
    from ghsweep.train.dolly_data import load_blocks
    from ghsweep.train.tokenizer import load_tokenizer

    config, recipe = written_recipe(tmp_path)
    dataset = recipe.dataset.instantiate()
    blocks = load_blocks(config, load_tokenizer(config))
    assert len(dataset) == len(blocks)
    item = dataset[0]
    assert torch.equal(item["input_ids"], blocks.input_ids[0])
    assert torch.equal(item["labels"][:-1], blocks.labels[0][1:]) and item["labels"][-1] == IGNORE_INDEX
    assert torch.equal(item["position_ids"], blocks.position_ids[0])


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_automodel_s_scheduler_steps_the_torch_backend_s_rates(tmp_path, schedule):
    """AutoModel's own scheduler, built from the recipe: the torch backend's warm-up exactly, the
    same peak and floor, the decay within one step of it."""
    config, recipe = written_recipe(tmp_path, "train.max_steps=20", "train.lr=0.01", f"train.lr_schedule={schedule}")
    t = config.train
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=t.lr)
    steps = recipe.step_scheduler.build(dataloader=[None] * 40, dp_group_size=1, local_batch_size=t.micro_batch_size)
    (scheduler,) = recipe.lr_scheduler.build(optimizer, steps)
    theirs = []
    for _ in range(t.max_steps):
        theirs.append(optimizer.param_groups[0]["lr"])
        scheduler.step(1)
    assert_steps_the_torch_backend_s_rates(theirs, t)
