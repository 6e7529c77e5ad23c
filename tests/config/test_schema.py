"""The schema says what each knob accepts; every knob it names exists in the composed config."""

from __future__ import annotations

from dataclasses import is_dataclass

import pytest
from omegaconf import OmegaConf

from ghsweep.config import schema
from ghsweep.core.errors import ConfigError
from tests.support.compose import compose_config

# Options whose sections carry every knob of the schema (precision=fp8 has library/scaling/format, ...).
FULL = ["precision=fp8", "memory=unified", "offload=on", "profile=nsys_ncu"]


def schema_keys(section: object = schema.ConfigSchema, prefix: str = "") -> list[str]:
    keys = []
    for name in schema._fields(section):
        node = schema._fields(section)[name]
        keys += schema_keys(node, f"{prefix}{name}.") if is_dataclass(node) else [f"{prefix}{name}"]
    return keys


@pytest.fixture(scope="module")
def full_config():
    return compose_config(*FULL)


@pytest.mark.parametrize("key", schema_keys())
def test_every_schema_knob_is_in_the_config_and_its_default_meets_the_rule(full_config, key):
    value = OmegaConf.select(full_config, key, default="<missing>")
    assert value != "<missing>"
    schema.check(key, value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("precision", "fp64", "precision=fp64: not an accepted value; accepted: fp32, fp16, bf16, fp8"),
        ("train.compile", "sometimes", "train.compile=sometimes: not an accepted value; accepted: auto, True, False"),
        ("train.max_steps", 2.5, "train.max_steps=2.5: must be an integer >= 1"),
        ("train.min_lr_ratio", -0.5, "train.min_lr_ratio=-0.5: must be a number >= 0 and <= 1"),
        ("train.grad_clip", 0, "train.grad_clip=0: must be a number > 0"),
        ("profile.nsys.trace", ["cuda", "gpu"], "profile.nsys.trace=gpu: not an accepted value; accepted: cuda, nvtx"),
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
