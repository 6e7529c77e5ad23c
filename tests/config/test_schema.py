"""The schema says what each knob accepts: every YAML leaf of conf/ has a rule its value meets, every rule
has a leaf, and `typed` turns each composed config into the schema's dataclasses."""

from __future__ import annotations

import os
from dataclasses import is_dataclass
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from ghsweep.config import schema
from ghsweep.core.errors import ConfigError
from tests.support.compose import compose_config, compose_typed
from tests.support.paths import CONF_DIR

# Keys a preset or launch profile may set that the schema leaves to others: Hydra's own tree, and the
# tune sweeper's section (hydra/sweeper=tune; ghsweep.tune.settings checks it).
NOT_MODELLED = ("hydra", "tune")
# Leaves whose value the option does not use, so it need not meet the rule (offload=off offloads no layer).
UNUSED_VALUES = {("offload/off.yaml", "offload.num_layers")}
PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def schema_keys(section: object = schema.ConfigSchema, prefix: str = "") -> list[str]:
    keys = []
    for name, node in schema._fields(section).items():
        keys += schema_keys(node, f"{prefix}{name}.") if is_dataclass(node) else [f"{prefix}{name}"]
    return keys


KNOBS = schema_keys()


def conf_files() -> list[Path]:
    """Every YAML of conf/, through its links (experiment -> experiments/, hydra/launcher -> launchers/)."""
    return sorted(
        Path(d) / f for d, _, names in os.walk(CONF_DIR, followlinks=True) for f in names if f.endswith(".yaml")
    )


def package(path: Path) -> str:
    """Where a file's keys go: its `# @package` header, else its group's path (the primary config: the root)."""
    first_line = path.read_text().split("\n", 1)[0]
    if first_line.startswith("# @package "):
        declared = first_line.removeprefix("# @package ").strip()
        return "" if declared == "_global_" else declared
    return path.parent.relative_to(CONF_DIR).as_posix().replace("/", ".").removeprefix(".")


def leaves(node: DictConfig, prefix: str) -> dict[str, object]:
    """The dotted leaves of `node` under `prefix` with their values (None for an interpolation or ???); a
    mapping the schema rules as one knob (container.env) is one leaf."""
    found: dict[str, object] = {}
    for name in map(str, node.keys()):
        key = f"{prefix}.{name}" if prefix else name
        child = node._get_node(name)
        if isinstance(child, DictConfig) and child and key not in KNOBS:
            found |= leaves(child, key)
        elif OmegaConf.is_interpolation(node, name) or OmegaConf.is_missing(node, name):
            found[key] = None
        else:
            found[key] = OmegaConf.to_container(child) if OmegaConf.is_config(child) else child._value()  # type: ignore[union-attr]
    return found


def conf_leaves() -> dict[tuple[str, str], object]:
    """(file, key) -> value for every leaf of every conf/ file outside Hydra's tree and the tune sweeper's
    section. Each option file is read on its own, so what a defaults list pulls in (profile=auto's nsys) is
    read from its own file; a defaults list sets no key."""
    found = {}
    for path in conf_files():
        node = OmegaConf.load(path)
        assert isinstance(node, DictConfig)
        node.pop("defaults", None)
        name = path.relative_to(CONF_DIR).as_posix()
        for key, value in leaves(node, package(path)).items():
            if key.split(".", 1)[0] not in NOT_MODELLED:
                found[(name, key)] = value
    return found


LEAVES = conf_leaves()


def test_the_walk_reads_groups_at_their_package():
    assert ("precision/bf16.yaml", "precision.reduce_dtype") in LEAVES
    assert ("profile/nsys.yaml", "profile.nsys.trace") in LEAVES
    assert ("hydra/launcher/gh200.yaml", "container.env") in LEAVES
    assert ("experiment/top5_roofline.yaml", "report.baseline") in LEAVES
    assert not [key for _, key in LEAVES if key.startswith(("hydra.", "tune."))]


@pytest.mark.parametrize("name, key", sorted(LEAVES))
def test_every_leaf_of_the_config_has_a_rule_its_value_meets(name, key):
    assert key in KNOBS, f"{name}: {key} has no rule in ghsweep/config/schema.py"
    if LEAVES[(name, key)] is not None and (name, key) not in UNUSED_VALUES:
        schema.check(key, LEAVES[(name, key)])


def test_every_rule_has_a_leaf():
    assert sorted(set(KNOBS) - {key for _, key in LEAVES}) == []


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("precision", "fp64", "precision=fp64: not an accepted value; accepted: fp32, fp16, bf16, fp8"),
        ("train.compile", "sometimes", "train.compile=sometimes: not an accepted value; accepted: auto, True, False"),
        ("train.max_steps", 2.5, "train.max_steps=2.5: must be an integer >= 1"),
        ("train.min_lr_ratio", -0.5, "train.min_lr_ratio=-0.5: must be a number >= 0 and <= 1"),
        ("train.grad_clip", 0, "train.grad_clip=0: must be a number > 0"),
        ("profile.nsys.trace", ["cuda", "gpu"], "profile.nsys.trace=gpu: not an accepted value; accepted: cuda, nvtx"),
        ("peft.dropout", 1, "peft.dropout=1: must be a number >= 0 and < 1"),
        (
            "peft.adapter_gemms",
            "joined",
            "peft.adapter_gemms=joined: not an accepted value; accepted: grouped, separate",
        ),
        ("peft.adapter_scale", "input", "peft.adapter_scale=input: not an accepted value; accepted: output, weight"),
        (
            "backend.recompute_granularity",
            "some",
            "backend.recompute_granularity=some: not an accepted value; accepted: null, selective, full",
        ),
        ("report.baseline", -1, "report.baseline=-1: not an accepted value; accepted: an integer >= 0, a string, null"),
        ("worker.timeout_min", "soon", "worker.timeout_min=soon: not an accepted value; accepted: a number > 0, auto"),
        ("model.path", 7, "model.path=7: must be a string"),
        ("container.binds", "/data", "container.binds=/data: must be a list"),
        ("container.env", ["A=1"], "container.env=['A=1']: must be a mapping of names to values"),
    ],
)
def test_a_broken_rule_is_one_line_naming_the_key_and_what_is_accepted(key, value, message):
    with pytest.raises(ConfigError) as err:
        schema.check(key, value)
    assert str(err.value).startswith(message)


def test_null_only_where_the_schema_says():
    schema.check("train.grad_clip", None)
    with pytest.raises(ConfigError, match=r"^train.lr=None: must be a number > 0 and <= 1$"):
        schema.check("train.lr", None)


def test_a_knob_of_several_kinds_accepts_each():
    for value in (0, "precision=bf16 offload=off", None):
        schema.check("report.baseline", value)
    for value in (30, 0.5, "auto", None):
        schema.check("worker.timeout_min", value)


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_every_preset_converts_to_the_typed_config_with_the_same_values(preset):
    cfg = compose_config(*([f"experiment={preset}"] if preset else []))
    config = schema.typed(cfg)
    assert isinstance(config, schema.ConfigSchema)
    for key in KNOBS:
        value = OmegaConf.select(cfg, key)
        found: object = config
        for part in key.split("."):
            found = getattr(found, part) if found is not None else None
        assert found == (OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value), key


def test_the_typed_config_reads_as_attributes():
    cfg = compose_config("experiment=top5_roofline", "precision=fp8")
    config = schema.typed(cfg)
    assert config.train.lr == cfg.model.lr.lora == 1.0e-4  # the interpolation, resolved
    assert config.precision.library == "auto" and config.precision.allow_tf32 is None  # fp32's knob, not fp8's
    assert config.profile.ncu.enabled is True and config.report.baseline == 0
    assert config.profile.nsys.trace == ["cuda", "nvtx"]
    assert type(config.profile.nsys.trace) is list and type(config.container.env) is dict
    assert not hasattr(config, "hydra")


def test_a_carried_knob_reads_as_its_value_and_is_none_under_other_options():
    fp8, bf16 = compose_typed("precision=fp8"), compose_typed("precision=bf16")
    assert schema.carried(fp8.precision.library, "precision.library") == "auto"
    assert bf16.precision.library is None
    with pytest.raises(ConfigError, match=r"^precision.library=None: the option that reads it sets it"):
        schema.carried(bf16.precision.library, "precision.library")


def test_null_is_refused_for_a_carried_knob_whose_option_carries_it():
    with pytest.raises(ConfigError, match=r"^precision.library=None: not an accepted value; accepted: auto, te"):
        schema.check("precision.library", None)


def test_a_typed_section_checks_its_knobs_and_its_own_rules():
    config = compose_typed("experiment=smoke", "offload=on")
    config.offload.check("model=tiny_llama", 4)
    config.offload.num_layers = 5
    with pytest.raises(
        ConfigError, match=r"^offload.num_layers=5: model=tiny_llama has only 4 layers; accepted: 1 to 4$"
    ):
        config.offload.check("model=tiny_llama", 4)
    config.dataloader.num_workers = -1
    with pytest.raises(ConfigError, match=r"^dataloader.num_workers=-1: must be an integer >= 0$"):
        config.dataloader.check()
