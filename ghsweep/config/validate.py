"""Checks a composed run config before any training starts.

Every error is one line that names the key, the bad value and what would be accepted, so a sweep
can record it as the reason a combination failed without spending GPU time on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from ghsweep.core.gpu import GpuInfo
from ghsweep.core.errors import ConfigError

# Linear layers of each architecture that LoRA can target (transformers' module names).
LINEAR_MODULES = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)
# A dolly record is a few KB; a longer line is not one record (a JSON array, a binary file).
MAX_RECORD_BYTES = 1 << 20
# train.attention (ghsweep/train/attention.py) and train.lr_schedule (ghsweep/train/optim.py).
ATTENTION_CHOICES = ("auto", "flex", "cudnn", "flash", "efficient", "math")
LR_SCHEDULES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class ModelFacts:
    """What validation needs to know about the model a run trains."""

    source: str  # how error messages name the model
    arch: str
    num_layers: int
    max_position_embeddings: int


def model_facts(model: DictConfig) -> ModelFacts:
    """The trained model's shape: its folder's config.json with `model.path`, else the model config.

    A loaded checkpoint brings its own shape, so `offload.num_layers` and `train.seq_length` are
    checked against the folder, not against the YAML the folder replaced.
    """
    if not model.path:
        return ModelFacts(f"model={model.name}", model.arch, model.num_layers, model.max_position_embeddings)
    folder = Path(model.path)
    if not folder.is_dir():
        raise ConfigError(f"model.path={model.path}: no such folder; expected a Hugging Face model folder")
    config_file = folder / "config.json"
    try:
        hf = json.loads(config_file.read_text())
        return ModelFacts(f"model.path={model.path}", hf["model_type"], int(hf["num_hidden_layers"]),
                          int(hf["max_position_embeddings"]))
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(
            f"model.path={model.path}: {config_file.name} is missing or lacks model_type, num_hidden_layers, "
            f"max_position_embeddings ({type(error).__name__}: {error}); expected a folder written by save_pretrained"
        ) from None


def _accepted(values) -> str:
    return ", ".join(str(v) for v in values)


def _check_choice(key: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{key}={value}: not an accepted value; accepted: {_accepted(accepted)}")


def _check_number(key: str, value, low: float, high: float | None, inclusive: bool = False) -> None:
    """A number above `low` (or from `low` with `inclusive`), up to `high` when given."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value >= low if inclusive else value > low) and (high is None or value <= high)
    if not ok:
        rng = f"{'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        raise ConfigError(f"{key}={value}: must be a number {rng}")


def check_int(key: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value}: must be an integer >= {minimum}")


def run_device(cfg: DictConfig, gpu: GpuInfo | None) -> str:
    """'cuda' or 'cpu': where this run will train."""
    if cfg.device == "auto":
        return "cuda" if gpu else "cpu"
    return "cuda" if str(cfg.device).startswith("cuda") else "cpu"


def validate(cfg: DictConfig, gpu: GpuInfo | None) -> None:
    """Raise ConfigError for the first value in `cfg` this run cannot use on this machine."""
    device = str(cfg.device)
    if device not in ("auto", "cpu") and not (device == "cuda" or device.startswith("cuda:")):
        raise ConfigError(f"device={device}: not an accepted value; accepted: auto, cpu, cuda, cuda:N")
    if device.startswith("cuda") and gpu is None:
        raise ConfigError(f"device={device}: no NVIDIA GPU is visible to this job; accepted here: auto, cpu")
    on_gpu = run_device(cfg, gpu) == "cuda"

    _check_choice("backend", cfg.backend.name, ("torch", "nemo", "automodel"))
    model = model_facts(cfg.model)
    _validate_model(cfg, model)
    _validate_train(cfg, model, on_gpu)
    _validate_peft(cfg, model)
    _validate_precision(cfg, gpu, on_gpu)
    _validate_offload(cfg, model)
    _check_choice("memory", cfg.memory.name, ("device", "unified"))
    if cfg.memory.name == "unified" and not on_gpu:
        raise ConfigError(
            "memory=unified: CUDA managed memory needs an NVIDIA GPU and this run has none "
            f"(device={device}); accepted here: memory=device"
        )
    if cfg.memory.name == "unified" and cfg.offload.enabled:
        # Offload frees GPU blocks while side streams still copy them; only PyTorch's own caching
        # allocator tracks that (record_stream), a managed-memory allocator does not.
        raise ConfigError("memory=unified with offload=on: not supported together; accepted: offload=off with "
                          "memory=unified, or memory=device with offload=on")
    _validate_dataloader(cfg)
    _validate_profile(cfg)
    if cfg.backend.name == "nemo":
        _validate_nemo(cfg, on_gpu)
    if cfg.backend.name == "automodel":
        _validate_automodel(cfg, on_gpu)


def _validate_nemo(cfg: DictConfig, on_gpu: bool) -> None:
    # Imported here: ghsweep.train.nemo.recipe imports ConfigError from this module (and no NeMo).
    from ghsweep.train.nemo.recipe import check_config

    # Without a container the worker trains in this interpreter, so its packages can be checked now.
    check_config(cfg, runtime=not OmegaConf.select(cfg, "container.image"))
    if not on_gpu:
        raise ConfigError(
            f"backend=nemo: training needs an NVIDIA GPU (Megatron) and this run has none (device={cfg.device}); "
            "accepted here: backend=torch"
        )


def _validate_automodel(cfg: DictConfig, on_gpu: bool) -> None:
    # Imported here: ghsweep.train.automodel.config imports ConfigError from this module (and no AutoModel).
    from ghsweep.train.automodel.config import check_config

    check_config(cfg)
    if not on_gpu:
        raise ConfigError(
            f"backend=automodel: training needs an NVIDIA GPU (FSDP2 over NCCL) and this run has none "
            f"(device={cfg.device}); accepted here: backend=torch"
        )


def _validate_model(cfg: DictConfig, model: ModelFacts) -> None:
    key = "model.arch" if not cfg.model.path else f"{model.source}: model_type"
    _check_choice(key, model.arch, tuple(LINEAR_MODULES))
    _check_choice("data.packing_mask", cfg.data.packing_mask, ("document", "causal"))
    if cfg.data.path:
        _validate_data_file(str(cfg.data.path))
    else:
        _check_number("data.mean_tokens", cfg.data.mean_tokens, 0, None)


def _validate_data_file(path: str) -> None:
    """Every line one dolly record, read before any training (bad lines would otherwise fail deep in the worker)."""
    if not Path(path).is_file():
        raise ConfigError(f"data.path={path}: no such file; expected a dolly-format JSONL file")
    expected = "expected one dolly record (a JSON object with instruction and response) per line"
    records = 0
    with open(path, "rb") as lines:
        for line_no, line in enumerate(lines, 1):
            if len(line) > MAX_RECORD_BYTES:
                raise ConfigError(f"data.path={path}: line {line_no} is {len(line):,} bytes, over "
                                  f"{MAX_RECORD_BYTES:,}; {expected}")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise ConfigError(f"data.path={path}: line {line_no} is not JSON ({str(error).splitlines()[0]}); "
                                  f"{expected}") from None
            if not isinstance(record, dict) or not {"instruction", "response"} <= record.keys():
                raise ConfigError(f"data.path={path}: line {line_no} lacks instruction or response; {expected}")
            records += 1
    if not records:
        raise ConfigError(f"data.path={path}: no records (the file is empty); {expected}")


def _validate_train(cfg: DictConfig, model: ModelFacts, on_gpu: bool) -> None:
    t = cfg.train
    check_int("train.max_steps", t.max_steps, 1)
    check_int("train.micro_batch_size", t.micro_batch_size, 1)
    check_int("train.warmup_steps", t.warmup_steps, 0)
    check_int("train.log_every", t.log_every, 1)
    check_int("train.seq_length", t.seq_length, 8)
    check_int("seed", cfg.seed, 0)
    _check_number("train.weight_decay", t.weight_decay, 0, None, inclusive=True)
    _check_choice("train.compile", t.compile, ("auto", True, False))
    _check_choice("train.attention", t.attention, ATTENTION_CHOICES)
    if t.attention == "flex" and (cfg.data.packing_mask != "document" or not on_gpu):
        raise ConfigError(
            f"train.attention=flex: FlexAttention here needs data.packing_mask=document and a GPU (it has no CPU "
            f"backward); this run has data.packing_mask={cfg.data.packing_mask}, device={cfg.device}; "
            f"accepted here: {_accepted(a for a in ATTENTION_CHOICES if a != 'flex')}"
        )
    try:
        lr = t.lr
    except InterpolationResolutionError:
        raise ConfigError(f"train.lr: {model.source} sets no rate for peft={cfg.peft.name} (model.lr.{cfg.peft.name}); "
                          "set train.lr=RATE or model.lr.lora / model.lr.none") from None
    _check_number("train.lr", lr, 0, None)
    _check_choice("train.lr_schedule", t.lr_schedule, LR_SCHEDULES)
    _check_number("train.lr_warmup_ratio", t.lr_warmup_ratio, 0, 1, inclusive=True)
    _check_number("train.min_lr_ratio", t.min_lr_ratio, 0, 1, inclusive=True)
    if t.grad_clip is not None:
        _check_number("train.grad_clip", t.grad_clip, 0, None)
    _check_number("train.activation_memory_budget", t.activation_memory_budget, 0, 1, inclusive=True)
    compiled = t.compile is True or (t.compile == "auto" and on_gpu)
    if t.activation_memory_budget < 1 and not compiled:
        raise ConfigError(
            f"train.activation_memory_budget={t.activation_memory_budget}: only compiled layers recompute, and this "
            f"run does not compile (train.compile={t.compile}, device={cfg.device}); accepted here: 1.0, or "
            "train.compile=true"
        )
    _check_choice("train.optimizer_in_backward", t.optimizer_in_backward, (True, False))
    if t.optimizer_in_backward and cfg.precision.name == "fp16":
        raise ConfigError("train.optimizer_in_backward=true: fp16's loss scaling must see every gradient before "
                          "any step; accepted with precision=fp16: false")
    if t.seq_length > model.max_position_embeddings:
        raise ConfigError(
            f"train.seq_length={t.seq_length}: longer than {model.source} supports; "
            f"accepted: 8 to {model.max_position_embeddings}"
        )


def _validate_peft(cfg: DictConfig, model: ModelFacts) -> None:
    peft = cfg.peft
    _check_choice("peft", peft.name, ("lora", "none"))
    if peft.name == "none":
        return
    check_int("peft.r", peft.r, 1)
    if not isinstance(peft.alpha, (int, float)) or peft.alpha <= 0:
        raise ConfigError(f"peft.alpha={peft.alpha}: must be a number > 0")
    if not isinstance(peft.dropout, (int, float)) or not 0 <= peft.dropout < 1:
        raise ConfigError(f"peft.dropout={peft.dropout}: must be in [0, 1)")
    available = LINEAR_MODULES[model.arch]
    targets = list(peft.target_modules or [])
    if not targets:
        raise ConfigError(f"peft.target_modules=[]: name at least one; accepted: {_accepted(available)}")
    for target in targets:
        if target not in available:
            raise ConfigError(
                f"peft.target_modules: {target!r} is not a linear module of {model.source} "
                f"({model.arch}); accepted: {_accepted(available)}"
            )


def _validate_precision(cfg: DictConfig, gpu: GpuInfo | None, on_gpu: bool) -> None:
    p = cfg.precision
    _check_choice("precision", p.name, ("fp32", "fp16", "bf16", "fp8"))
    if p.name != "fp8":
        return
    _check_choice("precision.library", p.library, ("auto", "te", "torchao"))
    _check_choice("precision.scaling", p.scaling, ("delayed", "current"))
    _check_choice("precision.format", p.format, ("hybrid", "e4m3"))
    need = ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY))
    if not on_gpu or gpu is None:
        raise ConfigError(
            f"precision=fp8: needs an NVIDIA GPU of compute capability >= {need} and this run has none "
            f"(device={cfg.device}); accepted here: fp32, fp16, bf16"
        )
    if gpu.compute_capability < FP8_MIN_COMPUTE_CAPABILITY:
        cc = ".".join(map(str, gpu.compute_capability))
        raise ConfigError(
            f"precision=fp8: {gpu.name} has compute capability {cc}, fp8 needs >= {need}; "
            "accepted here: fp32, fp16, bf16"
        )


def _validate_offload(cfg: DictConfig, model: ModelFacts) -> None:
    o = cfg.offload
    if not o.enabled:
        return
    layers = model.num_layers
    check_int("offload.num_layers", o.num_layers, 1)
    if o.num_layers > layers:
        raise ConfigError(
            f"offload.num_layers={o.num_layers}: {model.source} has only {layers} layers; "
            f"accepted: 1 to {layers}"
        )


def _validate_dataloader(cfg: DictConfig) -> None:
    dl = cfg.dataloader
    check_int("dataloader.num_workers", dl.num_workers, 0)
    if dl.prefetch_factor is not None:
        check_int("dataloader.prefetch_factor", dl.prefetch_factor, 1)


NSYS_TRACES = ("cuda", "nvtx", "osrt", "cudnn", "cublas", "cublas-verbose", "cusparse", "cusparse-verbose",
               "cudla", "cudla-verbose", "mpi", "oshmem", "ucx", "openacc", "openmp", "opengl", "opengl-annotations",
               "nvvideo", "vulkan", "vulkan-annotations", "python-gil", "syscall", "none")


def _validate_profile(cfg: DictConfig) -> None:
    p = cfg.profile
    _check_choice("profile", p.name, ("auto", "none", "torch", "nsys", "nsys_ncu"))
    limit = p.get("artifact_max_mb")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0):
        raise ConfigError(f"profile.artifact_max_mb={limit}: must be a number >= 0 (MB), or null for no limit")
    if "nsys" in p:
        for trace in p.nsys.trace:
            _check_choice("profile.nsys.trace", trace, NSYS_TRACES)
        _check_choice("profile.nsys.um_page_faults", p.nsys.um_page_faults, ("auto", True, False))
    if "ncu" in p:
        check_int("profile.ncu.top_k", p.ncu.top_k, 1)
