"""The config's schema: the type and the accepted values or range of every knob validation checks.

One dataclass per config section, mirroring conf/: `Literal[...]` lists a knob's choices, `Annotated[int,
Range(...)]` its bounds, `X | None` that null is accepted. ghsweep.config.validate reads a knob's rule from
here (`check`), so what a knob accepts is written once and the one-line errors name it.

The schema is not merged into Hydra's composition (as a ConfigStore base would be): Hydra composes every
combination of a sweep before the first runs, and a type error there stops the whole sweep, where a
ConfigError from validation fails only its combination and the sweep goes on (tests/reliability). The YAML
groups stay what users select (precision=bf16); the schema checks the values they set.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from dataclasses import dataclass, is_dataclass
from typing import Annotated, Literal, Union

from ghsweep.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A number from `low` (above it unless `inclusive`), up to `high` when given; ints always from `low`."""

    low: float
    high: float | None = None
    inclusive: bool = True


# Integers past this overflow the int32 and int64 arithmetic of the tensors and counters they size.
MAX_INT = 2**31 - 1

PositiveNumber = Annotated[float, Range(0, inclusive=False)]
Ratio = Annotated[float, Range(0, 1)]


@dataclass
class TrainSchema:
    max_steps: Annotated[int, Range(1)]
    micro_batch_size: Annotated[int, Range(1)]
    seq_length: Annotated[int, Range(8)]  # also at most the model's max_position_embeddings
    warmup_steps: Annotated[int, Range(0)]  # the fewest steps left out of step_time_ms as warm-up
    measure: Literal["auto", True, False]  # auto: measure past max_steps on a GPU (ghsweep/train/step_log.py)
    measure_ci_pct: PositiveNumber  # target half-width of step time's 95% interval, % of the median
    measure_max_steps: Annotated[int, Range(1)]  # step budget of a measuring run (at least max_steps)
    measure_max_s: PositiveNumber  # seconds of training after which a measuring run stops
    log_every: Annotated[int, Range(1)]
    lr: Annotated[float, Range(0, 1, inclusive=False)]  # peak learning rate
    lr_schedule: Literal["cosine", "linear", "constant"]  # ghsweep/train/schedule.py
    lr_warmup_ratio: Ratio
    min_lr_ratio: Ratio
    grad_clip: PositiveNumber | None  # global gradient norm; null: no clipping
    weight_decay: Annotated[float, Range(0)]
    compile: Literal["auto", True, False]  # auto: on a GPU only
    attention: Literal["auto", "flex", "cudnn", "flash", "efficient", "math"]  # ghsweep/train/attention.py
    activation_memory_budget: Ratio  # below 1.0 needs compiled layers
    optimizer: Literal["auto", "adamw", "adamw_sr", "adamw8bit"]  # ghsweep/train/optim.py
    optimizer_in_backward: bool  # not with precision=fp16


@dataclass
class DataSchema:
    name: Literal["dolly_synthetic", "dolly_file"]  # generated records, or data.path's
    packing_mask: Literal["document", "causal"]
    mean_tokens: Annotated[float, Range(0, 1_000_000, inclusive=False)]  # synthetic records only
    num_examples: Annotated[int, Range(1)]  # synthetic records only


@dataclass
class ModelSchema:
    """The shape of a model built from its config (model.path=null); a loaded folder brings its own."""

    hidden_size: Annotated[int, Range(1)]  # a multiple of num_attention_heads
    intermediate_size: Annotated[int, Range(1)]
    num_layers: Annotated[int, Range(1)]
    num_attention_heads: Annotated[int, Range(1)]  # a multiple of num_key_value_heads
    num_key_value_heads: Annotated[int, Range(1)]
    vocab_size: Annotated[int, Range(1)]
    max_position_embeddings: Annotated[int, Range(8)]
    rms_norm_eps: PositiveNumber


@dataclass
class CaptureSchema:
    start_step: Annotated[int, Range(0)]  # the profilers' window: steps start_step .. start_step + num_steps - 1
    num_steps: Annotated[int, Range(1)]


@dataclass
class PeftSchema:
    name: Literal["lora", "none"]
    r: Annotated[int, Range(1)]  # LoRA rank
    alpha: PositiveNumber


@dataclass
class PrecisionSchema:
    name: Literal["fp32", "fp16", "bf16", "fp8"]
    library: Literal["auto", "te", "torchao"]  # fp8: Transformer Engine or torchao
    scaling: Literal["delayed", "current"]
    format: Literal["hybrid", "e4m3"]


@dataclass
class OffloadSchema:
    num_layers: Annotated[int, Range(1)]  # with offload=on; at most the model's layers


@dataclass
class MemorySchema:
    name: Literal["device", "unified"]
    pool_size_gb: PositiveNumber | None  # RMM's managed pool; null: start small and grow


@dataclass
class DataloaderSchema:
    num_workers: Annotated[int, Range(0)]
    prefetch_factor: Annotated[int, Range(1)] | None


NsysTrace = Literal[
    "cuda",
    "nvtx",
    "osrt",
    "cudnn",
    "cublas",
    "cublas-verbose",
    "cusparse",
    "cusparse-verbose",
    "cudla",
    "cudla-verbose",
    "mpi",
    "oshmem",
    "ucx",
    "openacc",
    "openmp",
    "opengl",
    "opengl-annotations",
    "nvvideo",
    "vulkan",
    "vulkan-annotations",
    "python-gil",
    "syscall",
    "none",
]


@dataclass
class NsysSchema:
    trace: list[NsysTrace]  # `nsys profile --trace`
    um_page_faults: Literal["auto", True, False]  # auto: with memory=unified
    gpu_metrics: bool  # --gpu-metrics-devices: SM, tensor, DRAM and link activity over time


@dataclass
class NcuSchema:
    top_k: Annotated[int, Range(1)]  # kernels that get a roofline


@dataclass
class ProfileSchema:
    name: Literal["auto", "none", "torch", "memory", "nsys", "nsys_ncu"]
    nsys: NsysSchema
    ncu: NcuSchema


@dataclass
class SystemMetricsSchema:
    interval_s: PositiveNumber | None  # seconds between samples of GPU and host metrics; null: off


@dataclass
class WorkerSchema:
    preimported: bool  # fork workers from a pre-imported one (launch/worker_process.WarmWorker)


@dataclass
class ConfigSchema:
    seed: Annotated[int, Range(0)]
    repeat: Annotated[int, Range(1)]
    dry_run: bool
    force: bool
    wait: bool
    train: TrainSchema
    model: ModelSchema
    capture: CaptureSchema
    data: DataSchema
    peft: PeftSchema
    precision: PrecisionSchema
    offload: OffloadSchema
    memory: MemorySchema
    dataloader: DataloaderSchema
    profile: ProfileSchema
    system_metrics: SystemMetricsSchema
    worker: WorkerSchema


def _rule(key: str) -> object:
    """The annotation of `key` (dotted) in ConfigSchema, with its Annotated extras; a group's own key
    (`precision`, as users select it) is its option's name (`precision.name`)."""
    node = _rule_section(key)
    return _fields(node)["name"] if is_dataclass(node) else node


def knobs(section: str) -> list[str]:
    """The knobs of a config section (`train`), in the schema's order."""
    return list(_fields(_rule_section(section)))


def _rule_section(key: str) -> object:
    node: object = ConfigSchema
    for part in key.split("."):
        node = _fields(node)[part]
    return node


def _fields(section: object) -> dict[str, object]:
    assert is_dataclass(section), f"{section} is a knob, not a section of the schema"
    return typing.get_type_hints(section, globalns=vars(sys.modules[__name__]), include_extras=True)


def _without_none(rule: object) -> tuple[object, bool]:
    """(the rule a non-null value must meet, whether null is accepted)."""
    if typing.get_origin(rule) in (Union, types.UnionType):
        args = [a for a in typing.get_args(rule) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(rule))
    return rule, False


def choices(key: str) -> tuple:
    """The values `key` accepts (a Literal knob, a bool, or a list of Literal items)."""
    rule, _ = _without_none(_rule(key))
    if typing.get_origin(rule) is list:
        (rule,) = typing.get_args(rule)
    return (True, False) if rule is bool else typing.get_args(rule)


def accepted(values) -> str:
    return ", ".join(str(v) for v in values)


def check(key: str, value: object) -> None:
    """Raise ConfigError naming `key`, `value` and what is accepted when `value` breaks the schema's rule."""
    rule, nullable = _without_none(_rule(key))
    if value is None and nullable:
        return
    if typing.get_origin(rule) is list:
        for item in value:  # type: ignore[attr-defined]
            check_choice(key, item, choices(key))
    elif typing.get_origin(rule) is Literal or rule is bool:
        check_choice(key, value, choices(key))
    elif typing.get_origin(rule) is Annotated:
        kind, bounds = typing.get_args(rule)
        if kind is int:
            check_int(key, value, int(bounds.low))
        else:
            check_number(key, value, bounds)


def check_choice(key: str, value: object, accepted_values) -> None:
    # Booleans accept booleans only: `no` is a string and 1 is not True (Python's == says it is).
    if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted_values):
        raise ConfigError(f"{key}={value}: not an accepted value; accepted: {accepted(accepted_values)}")


def check_number(key: str, value: object, bounds: Range) -> None:
    low, high = bounds.low, bounds.high
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= low if bounds.inclusive else value > low) and (high is None or value <= high)  # type: ignore[operator]
    if not ok:
        rng = f"{'>=' if bounds.inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        raise ConfigError(f"{key}={value}: must be a number {rng}")


def check_int(key: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value}: must be an integer >= {minimum}")
    if value > MAX_INT:
        raise ConfigError(f"{key}={value}: too large; must be an integer from {minimum} to {MAX_INT}")
