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

A section checks itself (`ConfigSection`): its knobs against their fields' rules, then the rules between
them, in its own `check`, which ghsweep.config.validate calls section by section. A `Carried` knob is None
in the typed section both where its option lacks it and where a user set it to null: the sections with
such knobs are handed the keys their composed section sets (`composed_keys`), to refuse only the second.
Plain dataclasses, and `check` rather than `__post_init__`: building a section must not refuse it, since
the dry run types a refused combination to describe it and the launcher types one before it is validated,
and a section's rules need facts of the run a constructor does not get (the GPU, the model folder's shape,
the chosen profile). Not pydantic v2: it coerces values ("1" to 1, 1 to True) unless made strict, and says what is
wrong in its own words over several lines, where each refusal here is one line in the project's words.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from omegaconf import DictConfig, OmegaConf

from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo


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


class ConfigSection:
    """A config section as its dataclass: its knobs' rules are its fields' annotations, and the rules
    between its knobs (and the few facts of the run they need) are its own `check`, beside them."""

    def check_knobs(self, key: str, *names: str) -> None:
        """Each knob named (every one by default) against its field's rule; `key` is the section's."""
        rules = _fields(type(self))
        for name in names or tuple(rules):
            check_rule(f"{key}.{name}", rules[name], getattr(self, name))

    def check_composed(self, key: str, composed: frozenset[str], *names: str) -> None:
        """Each knob named that the composed section sets (`composed`, its `composed_keys`): a knob only
        some options carry is None in the typed section both where the option lacks it and where a user
        set it to null, and only the second is refused."""
        for name in names:
            if name in composed:
                self.check_knobs(key, name)


def composed_keys(node: DictConfig) -> frozenset[str]:
    """The keys a composed config section sets, a sub-section's as `sub.knob` too: what tells its typed
    section's knob set to null from one its option does not carry."""
    keys = set()
    for name in map(str, node):
        keys.add(name)
        value = node.get(name)
        if isinstance(value, DictConfig):
            keys.update(f"{name}.{sub}" for sub in composed_keys(value))
    return frozenset(keys)


@dataclass
class TrainSchema(ConfigSection):
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
    attention: Literal["auto", "flex", "cudnn", "flash", "efficient", "math"]  # ghsweep/train/packed_attention.py
    activation_memory_budget: Ratio  # below 1.0 needs compiled layers
    optimizer: Literal["auto", "adamw", "adamw_sr", "adamw8bit"]  # ghsweep/train/optimizer.py
    optimizer_in_backward: bool  # not with precision=fp16
    # Python's automatic garbage collection off in the loop, the young generations collected every N
    # steps (ghsweep/train/gc_pauses.py); null: Python's own collections
    gc_interval: Annotated[int, Range(1)] | None

    def compiles(self, on_gpu: bool) -> bool:
        """Whether the run's layers are compiled, where it trains on a GPU (`on_gpu`) or not."""
        return self.compile is True or (self.compile == "auto" and on_gpu)

    def check(
        self, model_source: str, max_positions: int, device: str, on_gpu: bool, data: DataSchema, precision: str
    ) -> None:
        """Against the trained model (`model_source` names it; `max_positions`: its longest sequence), the
        run's `device` setting and where it trains (`on_gpu`), its data and its `precision` option."""
        self.check_knobs("train")
        if self.attention == "flex" and (data.packing_mask != "document" or not on_gpu):
            raise ConfigError(
                f"train.attention=flex: FlexAttention here needs data.packing_mask=document and a GPU (it has no "
                f"CPU backward); this run has data.packing_mask={data.packing_mask}, device={device}; "
                f"accepted here: {accepted(a for a in choices('train.attention') if a != 'flex')}"
            )
        if self.activation_memory_budget < 1 and not self.compiles(on_gpu):
            raise ConfigError(
                f"train.activation_memory_budget={self.activation_memory_budget}: only compiled layers recompute, "
                f"and this run does not compile (train.compile={self.compile}, device={device}); accepted here: "
                "1.0, or train.compile=true"
            )
        cache_dir = self.compile_cache_dir
        if cache_dir is not None and (not str(cache_dir).strip() or Path(cache_dir).is_file()):
            raise ConfigError(
                f"train.compile_cache_dir={cache_dir!r}: not a folder; accepted: a folder's path (made if "
                "missing; relative: to the launch directory), or null (TORCHINDUCTOR_CACHE_DIR's, else torch's own)"
            )
        if self.optimizer_in_backward and precision == "fp16":
            raise ConfigError(
                "train.optimizer_in_backward=true: fp16's loss scaling must see every gradient before "
                "any step; accepted with precision=fp16: false"
            )
        if self.optimizer == "adamw_sr" and precision in ("fp32", "fp16"):
            raise ConfigError(
                f"train.optimizer=adamw_sr: stochastic rounding is for bf16 weights, and precision={precision} "
                f"trains fp32 ones; accepted with precision={precision}: auto, adamw, adamw8bit"
            )
        if self.seq_length > max_positions:
            raise ConfigError(
                f"train.seq_length={self.seq_length}: longer than {model_source} supports; "
                f"accepted: 8 to {max_positions}"
            )


# A dolly record is a few KB; a longer line is not one record (a JSON array, a binary file).
MAX_RECORD_BYTES = 1 << 20
# Fields of a dolly record the loader reads as text (`context` may be missing).
RECORD_TEXT_FIELDS = ("instruction", "context", "response")


@dataclass
class DataSchema(ConfigSection):
    name: Literal["dolly_synthetic", "dolly_file"]  # generated records, or data.path's
    path: str | None  # a dolly-format JSONL file (dolly_file); null: generated records
    packing_mask: Literal["document", "causal"]
    mean_tokens: Carried[Annotated[float, Range(0, 1_000_000, inclusive=False)]]  # synthetic records only
    num_examples: Annotated[int, Range(1)] | None  # records to use; null: all of data.path's (not synthetic)
    # ahead: tokenise and pack every record before training; on_the_fly: the loader (its workers with
    # dataloader.num_workers > 0) tokenises, masks and packs each batch's records as it is read, into the same
    # blocks (ghsweep/train/dolly_data.py). backend=torch only.
    prepare: Literal["ahead", "on_the_fly"]
    # For a model built from config (model.path brings its own): byte (UTF-8 bytes), bpe (the project's subword
    # tokenizer, ghsweep/train/tokenizer.py); auto: bpe with prepare=on_the_fly, byte ahead.
    tokenizer: Literal["auto", "byte", "bpe"]

    def check(self, backend: str, model_path: str | None, vocab_size: int) -> None:
        """For the run's `backend` and its model: loaded from `model_path`, or built with `vocab_size` ids."""
        self.check_knobs("data", "name", "packing_mask")
        if self.path and self.name == "dolly_synthetic":
            # The loader reads data.path whenever it is set: a run named synthetic would train on the file.
            raise ConfigError(
                f"data.path={self.path}: data=dolly_synthetic generates its records and reads no "
                "file; accepted: data=dolly_file with data.path, or data.path=null"
            )
        self.check_knobs("data", "path", "num_examples")
        if self.path:
            _check_data_file(str(self.path))
        else:
            self.check_knobs("data", "mean_tokens")
            if self.num_examples is None:
                raise ConfigError(
                    f"data.num_examples=None: data={self.name} generates this many records; accepted: an integer >= 1"
                )
        self.check_knobs("data", "prepare", "tokenizer")
        if backend != "torch" and (self.prepare != "ahead" or self.tokenizer != "auto"):
            key, value = (
                ("data.prepare", self.prepare) if self.prepare != "ahead" else ("data.tokenizer", self.tokenizer)
            )
            raise ConfigError(
                f"{key}={value}: backend={backend} loads the blocks packed ahead with its own tokenizer; "
                f"accepted with backend={backend}: data.prepare=ahead, data.tokenizer=auto"
            )
        if model_path:
            if self.tokenizer != "auto":
                raise ConfigError(
                    f"data.tokenizer={self.tokenizer}: model.path={model_path} brings its own tokenizer; accepted "
                    "with model.path: auto"
                )
            return
        if tokenizer_name(self) == "bpe" and vocab_size < BPE_VOCAB_SIZE:
            raise ConfigError(
                f"model.vocab_size={vocab_size}: below the {BPE_VOCAB_SIZE} ids of the bpe tokenizer this run "
                f"uses (data.tokenizer={self.tokenizer}, data.prepare={self.prepare}); accepted: at least "
                f"{BPE_VOCAB_SIZE}, or data.tokenizer=byte"
            )


def _check_data_file(path: str) -> None:
    """Every line one dolly record, read before any training (bad lines would otherwise fail deep in the worker)."""
    if not Path(path).is_file():
        raise ConfigError(f"data.path={path}: no such file; expected a dolly-format JSONL file")
    expected = "expected one dolly record (a JSON object with instruction and response) per line"
    records = 0
    with open(path, "rb") as lines:
        for line_no, line in enumerate(lines, 1):
            if len(line) > MAX_RECORD_BYTES:
                raise ConfigError(
                    f"data.path={path}: line {line_no} is {len(line):,} bytes, over {MAX_RECORD_BYTES:,}; {expected}"
                )
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ConfigError(
                    f"data.path={path}: line {line_no} is not JSON ({str(error).splitlines()[0]}); {expected}"
                ) from None
            if not isinstance(record, dict) or not {"instruction", "response"} <= record.keys():
                raise ConfigError(f"data.path={path}: line {line_no} lacks instruction or response; {expected}")
            for field in RECORD_TEXT_FIELDS:
                if field in record and not isinstance(record[field], str):
                    shown = json.dumps(record[field])[:40]
                    raise ConfigError(f"data.path={path}: line {line_no}: {field} is {shown}, not a string; {expected}")
            records += 1
    if not records:
        raise ConfigError(f"data.path={path}: no records (the file is empty); {expected}")


@dataclass
class ModelLrSchema:
    """The model's peak learning rate per peft, what train.lr defaults to."""

    lora: LearningRate
    none: LearningRate


# The ids of the byte tokenizer (train.tokenizer.ByteTokenizer): bytes 0-255, then BOS, EOS and PAD.
BYTE_TOKENIZER_IDS = 259
# The ids of the shipped byte-level BPE (train.tokenizer.BpeTokenizer, bpe_tokenizer.json).
BPE_VOCAB_SIZE = 320


# Linear layers of each architecture that LoRA can target (transformers' module names).
LINEAR_MODULES = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
# What names the model and its rates; the model's other knobs are its shape, read only without model.path.
MODEL_NOT_SHAPE = ("name", "arch", "path", "lr")


@dataclass
class ModelSchema(ConfigSection):
    """The model, and the shape of one built from its config (model.path=null); a loaded folder brings its own."""

    name: str  # names the model in runs and reports
    arch: str  # an architecture of LINEAR_MODULES; a loaded folder's model_type replaces it
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

    def check(self, arch: str, source: str) -> None:
        """`arch`: the trained model's architecture (a loaded folder's model_type), `source` names the model.
        A model built from its config must have a shape transformers can build (heads divide the width)."""
        check_choice("model.arch" if not self.path else f"{source}: model_type", arch, tuple(LINEAR_MODULES))
        if self.path:
            return
        self.check_knobs("model", *(knob for knob in knobs("model") if knob not in MODEL_NOT_SHAPE))
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"model.num_attention_heads={self.num_attention_heads}: does not divide "
                f"model.hidden_size={self.hidden_size}; accepted: a divisor of {self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"model.num_key_value_heads={self.num_key_value_heads}: does not divide model.num_attention_heads="
                f"{self.num_attention_heads}; accepted: a divisor of {self.num_attention_heads}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size}: {self.hidden_size // self.num_attention_heads} per head "
                f"(model.num_attention_heads={self.num_attention_heads}), an odd number rotary embeddings cannot "
                "split; accepted: an even width per head"
            )


@dataclass
class CaptureSchema(ConfigSection):
    # The profilers' window: steps start_step .. start_step + num_steps - 1; auto: the run's last
    # num_steps steps, right after its measured ones (capture_steps).
    start_step: Annotated[int, Range(0)] | Literal["auto"]
    num_steps: Annotated[int, Range(1)]

    def check(self, profile: str, backend: str, steps: int) -> None:
        """The window within the run's `steps` steps (train.max_steps), as `profile` and `backend` record it."""
        self.check_knobs("capture")
        if profile == "none":
            return
        if self.start_step == "auto" and self.num_steps > steps:
            raise ConfigError(
                f"capture.num_steps={self.num_steps}: capture.start_step=auto records the last capture.num_steps "
                f"steps of train.max_steps={steps}; accepted: capture.num_steps <= {steps}, or profile=none"
            )
        start = capture_steps(self, steps).start
        # The worker's own out-of-memory history covers steps 0-1 (train/memory_record.HISTORY_STEPS) and ends there.
        if profile == "memory" and start < 2:
            raise ConfigError(
                f"capture.start_step={self.start_step}: profile=memory records from step 2 on (the first two "
                "steps' history is kept for an out-of-memory error); accepted: capture.start_step >= 2, or auto "
                "with train.max_steps >= capture.num_steps + 2"
            )
        if profile == "memory" and backend != "torch":
            raise ConfigError(
                f"profile=memory: the capture window's allocator history is recorded by the torch backend's loop; "
                f"this run has backend={backend}; accepted: backend=torch, or profile=torch, nsys, auto, none"
            )
        if start + self.num_steps > steps:
            raise ConfigError(
                f"capture.start_step={self.start_step}, capture.num_steps={self.num_steps}: the profiler's window "
                f"ends after the last step ({steps - 1}, train.max_steps={steps}); accepted: start_step + "
                f"num_steps <= {steps}, start_step=auto, or profile=none"
            )


def capture_steps(capture: CaptureSchema, steps: int) -> range:
    """The steps `capture` records in a run of `steps` steps."""
    first = steps - capture.num_steps if capture.start_step == "auto" else int(capture.start_step)
    return range(first, first + capture.num_steps)


# LoRA's knobs: what peft=lora carries and peft=none must not.
LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "adapter_gemms", "adapter_scale")


@dataclass
class PeftSchema(ConfigSection):
    name: Literal["lora", "none"]
    r: Carried[Annotated[int, Range(1)]]  # LoRA rank (lora, as are the knobs below)
    alpha: Carried[PositiveNumber]
    dropout: Carried[Annotated[float, Range(0, 1, high_inclusive=False)]]
    target_modules: Carried[list[str]]  # linear modules of the model's arch (LINEAR_MODULES)
    # The A GEMMs of one input as one GEMM where the layers compile (backend=torch), or peft's apart.
    adapter_gemms: Carried[Literal["grouped", "separate"]]
    # alpha / r multiplies B's output (peft's) or B itself, where the layers compile (backend=torch)
    adapter_scale: Carried[Literal["output", "weight"]]

    def check(self, composed: frozenset[str], arch: str, source: str) -> None:
        """`composed`: the keys the composed section sets; `arch`: the trained model's architecture
        (`source` names the model)."""
        check("peft", self.name)
        if self.name == "none":
            # LoRA's keys set with peft=none would be ignored: the run would not be the one asked for.
            set_keys = [knob for knob in LORA_KEYS if knob in composed]
            if set_keys:
                raise ConfigError(
                    f"peft.{set_keys[0]}={getattr(self, set_keys[0])}: a LoRA setting, and peft=none trains every "
                    "weight without LoRA; accepted: peft=lora with it, or peft=none without it"
                )
            return
        self.check_knobs("peft", *LORA_KEYS)
        available = LINEAR_MODULES[arch]
        targets = carried(self.target_modules, "peft.target_modules")
        if not targets:
            raise ConfigError(f"peft.target_modules=[]: name at least one; accepted: {accepted(available)}")
        for target in targets:
            if target not in available:
                raise ConfigError(
                    f"peft.target_modules: {target!r} is not a linear module of {source} ({arch}); "
                    f"accepted: {accepted(available)}"
                )


FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


@dataclass
class PrecisionSchema(ConfigSection):
    name: Literal["fp32", "fp16", "bf16", "fp8"]
    library: Carried[Literal["auto", "te", "torchao"]]  # fp8 (as scaling and format): Transformer Engine or torchao
    scaling: Carried[Literal["delayed", "current"]]
    format: Carried[Literal["hybrid", "e4m3"]]
    allow_tf32: Carried[bool]  # fp32: TF32 matmuls on Ampere and newer
    initial_loss_scale: Carried[PositiveNumber]  # fp16: GradScaler's first scale
    # Of gradients across ranks (DDP, FSDP2); param: their own dtype; auto: param on two ranks, fp32 on more.
    reduce_dtype: Literal["auto", "fp32", "param"]

    def check(self, composed: frozenset[str], device: str, on_gpu: bool, gpu: GpuInfo | None) -> None:
        """`composed`: the keys the composed section sets; `device`: the run's setting, `on_gpu`: where it
        trains, `gpu`: the GPU it sees."""
        check("precision", self.name)
        # Each precision's own knobs (allow_tf32: fp32's, initial_loss_scale: fp16's).
        self.check_composed("precision", composed, "allow_tf32", "initial_loss_scale", "reduce_dtype")
        if self.name != "fp8":
            return
        self.check_knobs("precision", "library", "scaling", "format")
        need = ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))
        if not on_gpu or gpu is None:
            raise ConfigError(
                f"precision=fp8: needs an NVIDIA GPU of compute capability >= {need} and this run has none "
                f"(device={device}); accepted here: fp32, fp16, bf16"
            )
        if gpu.compute_capability < FP8_MIN_COMPUTE_CAPABILITY:
            cc = ".".join(map(str, gpu.compute_capability))
            raise ConfigError(
                f"precision=fp8: {gpu.name} has compute capability {cc}, fp8 needs >= {need}; "
                "accepted here: fp32, fp16, bf16"
            )


@dataclass
class OffloadSchema(ConfigSection):
    enabled: bool
    num_layers: Annotated[int, Range(1)]  # with offload=on; at most the model's layers
    # torch: how many layers of backward ahead an offloaded layer's activations start coming back;
    # auto: as early as the peak allows (ghsweep/train/offload.py).
    prefetch_layers: Carried[Annotated[int, Range(1)] | Literal["auto"]]

    def check(self, model_source: str, model_layers: int) -> None:
        """`model_layers`: the trained model's (`model_source` names it)."""
        self.check_knobs("offload", "enabled")
        if not self.enabled:
            return
        self.check_knobs("offload", "num_layers", "prefetch_layers")
        if self.num_layers > model_layers:
            raise ConfigError(
                f"offload.num_layers={self.num_layers}: {model_source} has only {model_layers} layers; "
                f"accepted: 1 to {model_layers}"
            )


@dataclass
class MemorySchema(ConfigSection):
    name: Literal["device", "unified"]
    pool_size_gb: PositiveNumber | None  # unified (as prefetch): RMM's managed pool; null: start small and grow
    prefetch: Carried[bool]  # managed pages to the GPU ahead of use

    def check(self, device: str, on_gpu: bool, offload: bool, in_container: bool) -> None:
        """`device`: the run's setting, `on_gpu`: where it trains; `offload`: offload=on; `in_container`:
        the worker runs in an image, not in this interpreter."""
        check("memory", self.name)
        if self.name != "unified":
            return
        if not on_gpu:
            raise ConfigError(
                "memory=unified: CUDA managed memory needs an NVIDIA GPU and this run has none "
                f"(device={device}); accepted here: memory=device"
            )
        if offload:
            # Offload frees GPU blocks while side streams still copy them; only PyTorch's own caching
            # allocator tracks that (record_stream), a managed-memory allocator does not.
            raise ConfigError(
                "memory=unified with offload=on: not supported together; accepted: offload=off with "
                "memory=unified, or memory=device with offload=on"
            )
        self.check_knobs("memory", "pool_size_gb", "prefetch")
        # Without a container the worker runs in this interpreter: whether RMM is there decides the allocator.
        if self.pool_size_gb is not None and not in_container and importlib.util.find_spec("rmm") is None:
            raise ConfigError(
                f"memory.pool_size_gb={self.pool_size_gb}: sizes RMM's managed pool and RMM is not "
                "installed here (the managed-memory allocator grows on demand); accepted here: null"
            )


@dataclass
class DataloaderSchema(ConfigSection):
    num_workers: Annotated[int, Range(0)]
    pin_memory: bool  # on a GPU only
    prefetch_factor: Annotated[int, Range(1)] | None
    persistent_workers: bool  # with num_workers > 0 only

    def check(self) -> None:
        self.check_knobs("dataloader")


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
class NsysSchema(ConfigSection):
    path: str | None  # the nsys executable; null: found on PATH
    trace: list[NsysTrace]  # `nsys profile --trace`
    um_page_faults: Literal["auto", True, False]  # auto: with memory=unified
    gpu_metrics: bool  # --gpu-metrics-devices: SM, tensor, DRAM and link activity over time
    extra_args: list[str]  # more `nsys profile` flags (--NAME=VALUE; capture/nsight_commands.py checks them)
    handoff: bool  # a forked worker exits once nsys holds its capture (core/handoff.py)


@dataclass
class NcuSchema(ConfigSection):
    enabled: bool  # a Nsight Compute pass after nsys (profile=nsys_ncu)
    path: str | None  # the ncu executable; null: found on PATH
    top_k: Annotated[int, Range(1)]  # kernels that get a roofline
    section_set: str  # `ncu --set`: one of the section sets `ncu --list-sets` names
    metrics: list[str]  # `ncu --metrics` added to the section set


@dataclass
class ProfileSchema(ConfigSection):
    name: Literal["auto", "none", "torch", "memory", "nsys", "nsys_ncu"]
    artifact_max_mb: Annotated[float, Range(0)] | None  # raw profiles larger are not uploaded; null: no limit
    nsys: Carried[NsysSchema]  # nsys, nsys_ncu and auto (as ncu)
    ncu: Carried[NcuSchema]

    def check(self, composed: frozenset[str]) -> None:
        """`composed`: the keys the composed section sets, its tools' as `nsys.trace`."""
        check("profile", self.name)
        self.check_knobs("profile", "artifact_max_mb")
        # The tools' sections the profile option carries (profile=torch: none), each knob where it is set.
        for tool, section in (("nsys", self.nsys), ("ncu", self.ncu)):
            if section is None:
                if tool in composed:
                    raise ConfigError(
                        f"profile.{tool}=None: not a section of {tool}'s knobs; accepted: its knobs set one by one "
                        f"(profile.{tool}.KNOB=VALUE)"
                    )
                continue
            set_knobs = {key.removeprefix(f"{tool}.") for key in composed if key.startswith(f"{tool}.")}
            section.check_composed(f"profile.{tool}", frozenset(set_knobs), *knobs(f"profile.{tool}"))


@dataclass
class SystemMetricsSchema(ConfigSection):
    interval_s: PositiveNumber | None  # seconds between samples of GPU and host metrics; null: off

    def check(self) -> None:
        self.check_knobs("system_metrics")


# worker.timeout_min=auto on a GPU: a hang on a cluster node must not hold its allocation until the
# scheduler's limit. On CPU (smoke runs, 7B shapes on a workstation) auto sets no limit.
GPU_TIMEOUT_MIN = 60


@dataclass
class WorkerSchema(ConfigSection):
    # Minutes before a worker is killed; auto: 60 on a GPU, none on CPU; null: no limit.
    timeout_min: PositiveNumber | Literal["auto"] | None
    preimported: bool  # fork workers from a pre-imported one (launch/warm_worker_client.WarmWorker)
    bytecode_cache: bool  # where Python keeps no bytecode, keep it in the user cache (launch/bytecode_cache.py)
    compile_ahead: bool  # compile later combinations' graphs beside the first (launch/compile_ahead.py)

    def check(self) -> None:
        self.check_knobs("worker", "preimported", "bytecode_cache", "compile_ahead")
        try:
            self.check_knobs("worker", "timeout_min")
        except ConfigError:  # the field's rule, said with what each accepted value means
            raise ConfigError(
                f"worker.timeout_min={self.timeout_min}: must be a number of minutes > 0, null (no limit) or auto "
                f"({GPU_TIMEOUT_MIN} on a GPU, no limit on CPU)"
            ) from None


@dataclass
class BackendSchema(ConfigSection):
    """The backend's keys; each option sets its own (num_nodes and gpus_per_node: torch and nemo)."""

    name: Literal["torch", "nemo", "automodel"]  # the backends of ghsweep.train.backends.BACKENDS
    num_nodes: Carried[Annotated[int, Range(1)]]
    gpus_per_node: Carried[Annotated[int, Range(1)]]  # ranks per node: one process per GPU
    data_parallel: Carried[Literal["auto", "ddp", "fsdp"]]  # torch: auto is DDP for LoRA, FSDP2 for full fine-tuning
    fsdp_reshard_after_forward: Carried[bool]  # torch, FSDP2: true is ZeRO-3
    fsdp_all_gather: Carried[Literal["auto", "nccl", "copy_engine"]]  # torch, FSDP2: copy_engine spares the SMs
    tensor_parallel: Carried[Annotated[int, Range(1)]]  # nemo: with pipeline_parallel, divides the run's GPUs
    pipeline_parallel: Carried[Annotated[int, Range(1)]]  # nemo
    recompute_granularity: Literal["selective", "full"] | None  # nemo, Megatron's; null: no recomputation
    recompute_method: Literal["block", "uniform"] | None  # nemo, with recompute_granularity=full
    recompute_num_layers: Annotated[int, Range(1)] | None  # nemo, with recompute_granularity=full

    def check(self, composed: frozenset[str]) -> None:
        """`composed`: the keys the composed section sets, the knobs its option carries (num_nodes: torch and
        nemo; tensor_parallel: nemo)."""
        check("backend", self.name)
        self.check_composed("backend", composed, *(knob for knob in knobs("backend") if knob != "name"))


@dataclass
class ContainerSchema(ConfigSection):
    image: str | None  # a .sif file, a docker:// or oras:// URI, or pyxis' registry image; null: on the host
    runtime: Literal["apptainer", "singularity", "pyxis"]
    nv: bool  # --nv: the host's GPUs inside (apptainer, singularity)
    binds: list[str]  # SRC[:DST[:ro]] each
    env: dict[str, object]  # NAME: value, set inside the container as its text
    python: str  # the image's interpreter

    def check(self) -> None:
        """Read only with an image (launch profiles that are not ghsweep's carry none)."""
        if self.image is None:
            return
        # runtime: launch/container.py checks it where it builds the container's command.
        self.check_knobs("container", *(knob for knob in knobs("container") if knob != "runtime"))


@dataclass
class TrackingSchema(ConfigSection):
    uri: str  # an MLflow tracking URI (tracking/mlflow_store.py checks what it opens)
    experiment: str  # the MLflow experiment, non-empty
    server_uri: str | None  # a launch profile's tracking server, what tracking=auto and server log to

    def check(self) -> None:
        """The experiment (the URI is checked where it is opened)."""
        if not isinstance(self.experiment, str) or not self.experiment.strip():
            raise ConfigError(
                f"tracking.experiment={self.experiment}: not an MLflow experiment name; accepted: a non-empty name"
            )


@dataclass
class ReportSchema(ConfigSection):
    # The comparison's baseline: a job number, or one combination's overrides; null: the first that finished.
    baseline: Annotated[int, Range(0)] | str | None

    def check(self) -> None:
        self.check_knobs("report")


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
    check_rule(key, _rule(key), value)


def check_rule(key: str, rule: object, value: object) -> None:
    """check, with `key`'s rule at hand."""
    rules, nullable = _alternatives(rule)
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
