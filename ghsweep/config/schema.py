"""The config's schema: the type and the accepted values or range of every knob validation checks.

One dataclass per config section, mirroring conf/: `Literal[...]` lists a knob's choices, `Annotated[int,
Range(...)]` its bounds, `X | None` that null is accepted, `Carried[X]` a knob only some options of its group
carry. ghsweep.config.validate reads a knob's rule from here (`check`), so what a knob accepts is written once
and the one-line errors name it.

The schema is not merged into Hydra's composition (as a ConfigStore base would be): Hydra composes every
combination of a sweep before the first runs, and a type error there stops the whole sweep, where a
ConfigError from validation fails only its combination and the sweep goes on (tests/reliability). The YAML
groups stay what users select (precision=bf16); the schema checks the values they set, and `typed` turns a
validated config into the schema's dataclasses, the config the plan, the worker and the backends read.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, is_dataclass
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from omegaconf import DictConfig, OmegaConf

from ghsweep.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A number from `low` (above it unless `inclusive`), up to `high` when given (below it unless
    `high_inclusive`); ints always from `low`."""

    low: float
    high: float | None = None
    inclusive: bool = True
    high_inclusive: bool = True


T = TypeVar("T")


class _OnlySomeOptions:
    """The marker of `Carried`."""


ONLY_SOME_OPTIONS = _OnlySomeOptions()
# A knob or section only some options of its group carry (precision.library: fp8's). The typed config holds
# None under the others, so code reading it narrows first; users still may not set it to null (the rule is T).
Carried = Annotated[Optional[T], ONLY_SOME_OPTIONS]  # noqa: UP045 (`T | None` is no generic alias on Python 3.10)

# Integers past this overflow the int32 and int64 arithmetic of the tensors and counters they size.
MAX_INT = 2**31 - 1

PositiveNumber = Annotated[float, Range(0, inclusive=False)]
Ratio = Annotated[float, Range(0, 1)]
LearningRate = Annotated[float, Range(0, 1, inclusive=False)]


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
    lr: LearningRate  # peak learning rate
    lr_schedule: Literal["cosine", "linear", "constant"]  # ghsweep/train/schedule.py
    lr_warmup_ratio: Ratio
    min_lr_ratio: Ratio
    grad_clip: PositiveNumber | None  # global gradient norm; null: no clipping
    weight_decay: Annotated[float, Range(0)]
    compile: Literal["auto", True, False]  # auto: on a GPU only
    # torch.compile's caches (ghsweep/train/compile_cache.py): a folder (relative: to the launch
    # directory) every node reads; null: TORCHINDUCTOR_CACHE_DIR's, else torch's own (one per machine)
    compile_cache_dir: str | None
    attention: Literal["auto", "flex", "cudnn", "flash", "efficient", "math"]  # ghsweep/train/attention.py
    activation_memory_budget: Ratio  # below 1.0 needs compiled layers
    optimizer: Literal["auto", "adamw", "adamw_sr", "adamw8bit"]  # ghsweep/train/optim.py
    optimizer_in_backward: bool  # not with precision=fp16


@dataclass
class DataSchema:
    name: Literal["dolly_synthetic", "dolly_file"]  # generated records, or data.path's
    path: str | None  # a dolly-format JSONL file (dolly_file); null: generated records
    packing_mask: Literal["document", "causal"]
    mean_tokens: Carried[Annotated[float, Range(0, 1_000_000, inclusive=False)]]  # synthetic records only
    num_examples: Annotated[int, Range(1)] | None  # records to use; null: all of data.path's (not synthetic)
    # ahead: tokenise and pack every record before training; on_the_fly: the loader (its workers with
    # dataloader.num_workers > 0) tokenises, masks and packs each batch's records as it is read, into the same
    # blocks (ghsweep/train/data.py). backend=torch only.
    prepare: Literal["ahead", "on_the_fly"]
    # For a model built from config (model.path brings its own): byte (UTF-8 bytes), bpe (the project's subword
    # tokenizer, ghsweep/train/tokenizer.py); auto: bpe with prepare=on_the_fly, byte ahead.
    tokenizer: Literal["auto", "byte", "bpe"]


@dataclass
class ModelLrSchema:
    """The model's peak learning rate per peft, what train.lr defaults to."""

    lora: LearningRate
    none: LearningRate


# The ids of the byte tokenizer (train.tokenizer.ByteTokenizer): bytes 0-255, then BOS, EOS and PAD.
BYTE_TOKENIZER_IDS = 259
# The ids of the shipped byte-level BPE (train.tokenizer.BpeTokenizer, bpe_tokenizer.json).
BPE_VOCAB_SIZE = 320


@dataclass
class ModelSchema:
    """The model, and the shape of one built from its config (model.path=null); a loaded folder brings its own."""

    name: str  # names the model in runs and reports
    arch: str  # an architecture of validate.LINEAR_MODULES; a loaded folder's model_type replaces it
    path: str | None  # a Hugging Face model folder (save_pretrained); null: built from this config
    hidden_size: Annotated[int, Range(1)]  # a multiple of num_attention_heads
    intermediate_size: Annotated[int, Range(1)]
    num_layers: Annotated[int, Range(1)]
    num_attention_heads: Annotated[int, Range(1)]  # a multiple of num_key_value_heads
    num_key_value_heads: Annotated[int, Range(1)]
    # At least the byte tokenizer's ids (a model built from config trains with it): 256 bytes, BOS, EOS, PAD.
    vocab_size: Annotated[int, Range(BYTE_TOKENIZER_IDS)]
    max_position_embeddings: Annotated[int, Range(8)]
    rms_norm_eps: PositiveNumber
    lr: ModelLrSchema


@dataclass
class CaptureSchema:
    # The profilers' window: steps start_step .. start_step + num_steps - 1; auto: the run's last
    # num_steps steps, right after its measured ones (capture_steps).
    start_step: Annotated[int, Range(0)] | Literal["auto"]
    num_steps: Annotated[int, Range(1)]


def capture_steps(capture: CaptureSchema, steps: int) -> range:
    """The steps `capture` records in a run of `steps` steps."""
    first = steps - capture.num_steps if capture.start_step == "auto" else int(capture.start_step)
    return range(first, first + capture.num_steps)


@dataclass
class PeftSchema:
    name: Literal["lora", "none"]
    r: Carried[Annotated[int, Range(1)]]  # LoRA rank (lora, as are the knobs below)
    alpha: Carried[PositiveNumber]
    dropout: Carried[Annotated[float, Range(0, 1, high_inclusive=False)]]
    target_modules: Carried[list[str]]  # linear modules of the model's arch (validate.LINEAR_MODULES)


@dataclass
class PrecisionSchema:
    name: Literal["fp32", "fp16", "bf16", "fp8"]
    library: Carried[Literal["auto", "te", "torchao"]]  # fp8 (as scaling and format): Transformer Engine or torchao
    scaling: Carried[Literal["delayed", "current"]]
    format: Carried[Literal["hybrid", "e4m3"]]
    allow_tf32: Carried[bool]  # fp32: TF32 matmuls on Ampere and newer
    initial_loss_scale: Carried[PositiveNumber]  # fp16: GradScaler's first scale
    reduce_dtype: Literal["fp32", "param"]  # of gradients across ranks (FSDP2); param: their own dtype


@dataclass
class OffloadSchema:
    enabled: bool
    num_layers: Annotated[int, Range(1)]  # with offload=on; at most the model's layers


@dataclass
class MemorySchema:
    name: Literal["device", "unified"]
    pool_size_gb: PositiveNumber | None  # unified (as prefetch): RMM's managed pool; null: start small and grow
    prefetch: Carried[bool]  # managed pages to the GPU ahead of use


@dataclass
class DataloaderSchema:
    num_workers: Annotated[int, Range(0)]
    pin_memory: bool  # on a GPU only
    prefetch_factor: Annotated[int, Range(1)] | None
    persistent_workers: bool  # with num_workers > 0 only


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
    path: str | None  # the nsys executable; null: found on PATH
    trace: list[NsysTrace]  # `nsys profile --trace`
    um_page_faults: Literal["auto", True, False]  # auto: with memory=unified
    gpu_metrics: bool  # --gpu-metrics-devices: SM, tensor, DRAM and link activity over time
    extra_args: list[str]  # more `nsys profile` flags (--NAME=VALUE; profile/capture.py checks them)
    handoff: bool  # a forked worker exits once nsys holds its capture (core/handoff.py)


@dataclass
class NcuSchema:
    enabled: bool  # a Nsight Compute pass after nsys (profile=nsys_ncu)
    path: str | None  # the ncu executable; null: found on PATH
    top_k: Annotated[int, Range(1)]  # kernels that get a roofline
    section_set: str  # `ncu --set`: one of the section sets `ncu --list-sets` names
    metrics: list[str]  # `ncu --metrics` added to the section set


@dataclass
class ProfileSchema:
    name: Literal["auto", "none", "torch", "memory", "nsys", "nsys_ncu"]
    artifact_max_mb: Annotated[float, Range(0)] | None  # raw profiles larger are not uploaded; null: no limit
    nsys: Carried[NsysSchema]  # nsys, nsys_ncu and auto (as ncu)
    ncu: Carried[NcuSchema]


@dataclass
class SystemMetricsSchema:
    interval_s: PositiveNumber | None  # seconds between samples of GPU and host metrics; null: off


@dataclass
class WorkerSchema:
    # Minutes before a worker is killed; auto: 60 on a GPU, none on CPU; null: no limit.
    timeout_min: PositiveNumber | Literal["auto"] | None
    preimported: bool  # fork workers from a pre-imported one (launch/warm_worker_client.WarmWorker)


@dataclass
class BackendSchema:
    """The backend's keys; each option sets its own (num_nodes and gpus_per_node: torch and nemo)."""

    name: str  # a backend of config.backends.BACKENDS, the registry validation checks it against
    num_nodes: Carried[Annotated[int, Range(1)]]
    gpus_per_node: Carried[Annotated[int, Range(1)]]  # ranks per node: one process per GPU
    data_parallel: Carried[Literal["auto", "ddp", "fsdp"]]  # torch: auto is DDP for LoRA, FSDP2 for full fine-tuning
    fsdp_reshard_after_forward: Carried[bool]  # torch, FSDP2: true is ZeRO-3
    tensor_parallel: Carried[Annotated[int, Range(1)]]  # nemo: with pipeline_parallel, divides the run's GPUs
    pipeline_parallel: Carried[Annotated[int, Range(1)]]  # nemo
    recompute_granularity: Literal["selective", "full"] | None  # nemo, Megatron's; null: no recomputation
    recompute_method: Literal["block", "uniform"] | None  # nemo, with recompute_granularity=full
    recompute_num_layers: Annotated[int, Range(1)] | None  # nemo, with recompute_granularity=full


@dataclass
class ContainerSchema:
    image: str | None  # a .sif file, a docker:// or oras:// URI, or pyxis' registry image; null: on the host
    runtime: Literal["apptainer", "singularity", "pyxis"]
    nv: bool  # --nv: the host's GPUs inside (apptainer, singularity)
    binds: list[str]  # SRC[:DST[:ro]] each
    env: dict[str, object]  # NAME: value, set inside the container as its text
    python: str  # the image's interpreter


@dataclass
class TrackingSchema:
    uri: str  # an MLflow tracking URI (tracking/mlflow_store.py checks what it opens)
    experiment: str  # the MLflow experiment, non-empty
    server_uri: str | None  # a launch profile's tracking server, what tracking=auto and server log to


@dataclass
class ReportSchema:
    # The comparison's baseline: a job number, or one combination's overrides; null: the first that finished.
    baseline: Annotated[int, Range(0)] | str | None


@dataclass
class ConfigSchema:
    seed: Annotated[int, Range(0)]
    repeat: Annotated[int, Range(1)]
    device: str  # auto, cpu, cuda or cuda:N (validate.validate checks the form)
    dry_run: bool
    force: bool
    wait: bool
    backend: BackendSchema
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
    container: ContainerSchema
    tracking: TrackingSchema
    report: ReportSchema


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
    """The rules of a section's knobs: what a user may set, so `Carried[T]` is T."""
    assert is_dataclass(section), f"{section} is a knob, not a section of the schema"
    hints = typing.get_type_hints(section, globalns=vars(sys.modules[__name__]), include_extras=True)
    return {name: _users_rule(hint) for name, hint in hints.items()}


def _users_rule(hint: object) -> object:
    if typing.get_origin(hint) is not Annotated or ONLY_SOME_OPTIONS not in hint.__metadata__:  # type: ignore[attr-defined]
        return hint
    not_null = [rule for rule in typing.get_args(typing.get_args(hint)[0]) if rule is not type(None)]
    return not_null[0] if len(not_null) == 1 else Union[tuple(not_null)]  # noqa: UP007


def _alternatives(rule: object) -> tuple[list[object], bool]:
    """(the rules a non-null value may meet, one of which it must, whether null is accepted)."""
    if typing.get_origin(rule) in (Union, types.UnionType):
        args = typing.get_args(rule)
        return [a for a in args if a is not type(None)], type(None) in args
    return [rule], False


def choices(key: str) -> tuple:
    """The values `key` accepts (a Literal knob, a bool, or a list of Literal items)."""
    rule = _alternatives(_rule(key))[0][0]
    if typing.get_origin(rule) is list:
        (rule,) = typing.get_args(rule)
    return (True, False) if rule is bool else typing.get_args(rule)


def accepted(values) -> str:
    return ", ".join("null" if v is None else str(v) for v in values)


def check(key: str, value: object) -> None:
    """Raise ConfigError naming `key`, `value` and what is accepted when `value` breaks the schema's rule."""
    rules, nullable = _alternatives(_rule(key))
    if value is None and nullable:
        return
    if len(rules) == 1:
        _check_rule(key, rules[0], value, nullable)
    elif not any(_meets(key, rule, value) for rule in rules):
        shown = [_describe(rule) for rule in rules] + (["null"] if nullable else [])
        raise ConfigError(f"{key}={value}: not an accepted value; accepted: {', '.join(shown)}")


def _meets(key: str, rule: object, value: object) -> bool:
    try:
        _check_rule(key, rule, value, nullable=False)
    except ConfigError:
        return False
    return True


def _check_rule(key: str, rule: object, value: object, nullable: bool) -> None:
    origin = typing.get_origin(rule)
    if origin is list:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{key}={value}: must be a list")
        (item,) = typing.get_args(rule)
        for v in value:
            _check_rule(key, item, v, nullable=False)
    elif origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
            raise ConfigError(f"{key}={value}: must be a mapping of names to values")
    elif origin is Literal or rule is bool:
        values = (True, False) if rule is bool else typing.get_args(rule)
        check_choice(key, value, ((None,) if nullable else ()) + values)
    elif origin is Annotated:
        kind, bounds = typing.get_args(rule)
        if kind is int:
            check_int(key, value, int(bounds.low))
        else:
            check_number(key, value, bounds)
    elif rule is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value}: must be a string")
    else:
        assert rule is object, f"{key}: no check for the rule {rule}"


def _describe(rule: object) -> str:
    """What a value meeting `rule` is, for the error of a knob with several alternatives."""
    origin = typing.get_origin(rule)
    if origin is Annotated:
        kind, bounds = typing.get_args(rule)
        return f"an integer >= {int(bounds.low)}" if kind is int else f"a number {_range_text(bounds)}"
    if origin is Literal:
        return accepted(typing.get_args(rule))
    return "a string" if rule is str else str(rule)


def check_choice(key: str, value: object, accepted_values) -> None:
    # Booleans accept booleans only: `no` is a string and 1 is not True (Python's == says it is).
    if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted_values):
        raise ConfigError(f"{key}={value}: not an accepted value; accepted: {accepted(accepted_values)}")


def check_number(key: str, value: object, bounds: Range) -> None:
    low, high = bounds.low, bounds.high
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= low if bounds.inclusive else value > low)  # type: ignore[operator]
    ok = ok and (high is None or (value <= high if bounds.high_inclusive else value < high))  # type: ignore[operator]
    if not ok:
        raise ConfigError(f"{key}={value}: must be a number {_range_text(bounds)}")


def _range_text(bounds: Range) -> str:
    text = f"{'>=' if bounds.inclusive else '>'} {bounds.low}"
    if bounds.high is not None:
        text += f" and {'<=' if bounds.high_inclusive else '<'} {bounds.high}"
    return text


def check_int(key: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value}: must be an integer >= {minimum}")
    if value > MAX_INT:
        raise ConfigError(f"{key}={value}: too large; must be an integer from {minimum} to {MAX_INT}")


def carried(value: T | None, key: str) -> T:
    """The value of a `Carried` knob, read by code that runs only under an option carrying it (validation
    has checked it there); ConfigError for a config that reaches that code without it."""
    if value is None:
        raise ConfigError(f"{key}=None: the option that reads it sets it; was this config validated?")
    return value


Section = TypeVar("Section")


def typed(cfg: DictConfig) -> ConfigSchema:
    """The composed config `cfg` (validated; interpolations are resolved as they are read) as the schema's
    dataclasses, lists and mappings as plain ones. What the schema does not model (hydra, tune) is left
    out; a knob or section the chosen options do not carry (precision.library with precision=bf16,
    profile.nsys with profile=none) is None."""
    return _build(ConfigSchema, cfg)


def typed_section(section: type[Section], node: DictConfig) -> Section:
    """One section of a composed config (`cfg.profile`) as its dataclass (`ProfileSchema`), as `typed`
    builds it: for code handed a section alone, before any combination is validated (a Hydra callback's
    arguments)."""
    return _build(section, node)


def _build(section: type[Section], node: DictConfig) -> Section:
    values: dict[str, Any] = {}
    for name, rule in _fields(section).items():
        value = node.get(name)
        sub = _alternatives(rule)[0][0]
        if isinstance(sub, type) and is_dataclass(sub) and value is not None:
            values[name] = _build(sub, value)
        else:
            values[name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return section(**values)


def tokenizer_name(data: DataSchema | DictConfig) -> str:
    """byte or bpe, the tokenizer of a model built from config (model.path brings its own): data.tokenizer,
    where auto is bpe for a loader that tokenises on the fly (its work is then a real tokenizer's) and byte
    ahead of training (as before the knob)."""
    if data.tokenizer != "auto":
        return str(data.tokenizer)
    return "bpe" if data.prepare == "on_the_fly" else "byte"
