"""Checks a composed run config before any training starts.

Every error is one line that names the key, the bad value and what would be accepted, so a sweep
can record it as the reason a combination failed without spending GPU time on it.
"""

from __future__ import annotations

import re
import shlex

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from ghsweep.config.model_facts import ModelFacts, model_facts
from ghsweep.config.schema import (
    BackendSchema,
    ConfigSchema,
    ReportSchema,
    TrackingSchema,
    check,
    composed_keys,
    typed,
    typed_section,
)
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo


def run_device(config: ConfigSchema, gpu: GpuInfo | None) -> str:
    """'cuda' or 'cpu': where this run will train."""
    return _trains_on(config.device, gpu)


def _trains_on(device: str, gpu: GpuInfo | None) -> str:
    if device == "auto":
        return "cuda" if gpu else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def validate(cfg: DictConfig, gpu: GpuInfo | None) -> ConfigSchema:
    """`cfg` as the typed config the run reads; ConfigError for the first value in it this run cannot use on
    this machine. The chosen backend's own keys are its own to check (ghsweep.launch.run_planner.checked_config,
    what the plan calls)."""
    device = str(cfg.device)
    if device not in ("auto", "cpu") and not (device == "cuda" or device.startswith("cuda:")):
        raise ConfigError(f"device={device}: not an accepted value; accepted: auto, cpu, cuda, cuda:N")
    if device.startswith("cuda") and gpu is None:
        raise ConfigError(f"device={device}: no NVIDIA GPU is visible to this job; accepted here: auto, cpu")
    on_gpu = _trains_on(device, gpu) == "cuda"

    # Typed alone: its refusals come before the model folder's, and `typed` reads train.lr, checked after.
    typed_section(BackendSchema, cfg.backend).check(composed_keys(cfg.backend))
    model = model_facts(cfg.model)
    _check_rate_resolves(cfg, model)
    config = typed(cfg)
    config.model.check(model.arch, model.source)
    config.data.check(config.backend.name, config.model.path, config.model.vocab_size)
    check("seed", config.seed)
    check("repeat", config.repeat)
    config.system_metrics.check()
    config.train.check(model.source, model.max_position_embeddings, device, on_gpu, config.data, config.precision.name)
    config.peft.check(composed_keys(cfg.peft), model.arch, model.source)
    config.precision.check(composed_keys(cfg.precision), device, on_gpu, gpu)
    config.offload.check(model.source, model.num_layers)
    in_container = config.container is not None and config.container.image is not None
    config.memory.check(device, on_gpu, config.offload.enabled, in_container)
    config.dataloader.check()
    config.profile.check(composed_keys(cfg.profile))
    config.capture.check(config.profile.name, config.backend.name, config.train.max_steps)
    config.worker.check()
    if config.container is not None:
        config.container.check()
    return config


def _check_rate_resolves(cfg: DictConfig, model: ModelFacts) -> None:
    """train.lr defaults to the model's rate for the run's peft, an interpolation the model may lack."""
    try:
        _ = cfg.train.lr
    except InterpolationResolutionError:
        raise ConfigError(
            f"train.lr: {model.source} sets no rate for peft={cfg.peft.name} (model.lr.{cfg.peft.name}); "
            "set train.lr=RATE or model.lr.lora / model.lr.none"
        ) from None


# What a run directory's files may be named after (hydra.job.name names the job's log file).
SAFE_NAME = re.compile(r"^[\w.\-]+$")


def validate_launch(cfg: DictConfig, job_name: str) -> None:
    """The keys a sweep or run reads before any run's own validation: its switches, its MLflow experiment,
    the job's name (its log file's) and every interpolation. ConfigError, one line, before any record."""
    for switch in ("dry_run", "force", "wait"):
        check(switch, cfg[switch])
    typed_section(ReportSchema, cfg.report).check()
    launcher = OmegaConf.select(cfg, "hydra.launcher")
    if launcher is not None:
        launcher_retries(launcher)
        _check_launcher_tokens(launcher)
    if not SAFE_NAME.match(job_name) or job_name in (".", ".."):
        raise ConfigError(
            f"hydra.job.name={job_name}: names the job's log file in its run directory; accepted: letters, "
            "digits, '_', '-' and '.', no path"
        )
    for key in cfg:
        if key != "hydra":
            _check_resolves(cfg, str(key))
    # Typed once every value is known to resolve (tracking.uri may read the environment).
    typed_section(TrackingSchema, cfg.tracking).check()


def _check_resolves(cfg: DictConfig, key: str) -> None:
    try:
        OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
    except InterpolationResolutionError as error:
        where = getattr(error, "full_key", None) or key
        raise ConfigError(
            f"{where}: {str(error).splitlines()[0]}; set what it names, or give it a default (${{oc.env:NAME,default}})"
        ) from None


# The launcher keys that are lines of shell by design (each item one line of the batch script).
SHELL_LINE_KEYS = ("setup",)


def _check_launcher_tokens(launcher: DictConfig) -> None:
    """Every launcher value goes into the batch script (an #SBATCH option) or a shell command (srun's
    arguments): one that cannot be one token there is refused. A newline would end the #SBATCH line and
    run the rest as shell (and sbatch reads no option after it); a NUL cuts the script; an unbalanced
    quote swallows what follows. `setup` items are lines of shell themselves: only one line each."""
    try:
        values = OmegaConf.to_container(launcher, resolve=True)
    except InterpolationResolutionError:  # said by _check_resolves, or by the launcher that reads it
        return
    for key, value in _leaves("hydra.launcher", values):
        text = str(value)
        shell_line = key.split(".")[2].split("[")[0] in SHELL_LINE_KEYS
        problem = (
            "a NUL character"
            if "\0" in text
            else "a line break"
            if "\n" in text or "\r" in text
            else None
            if shell_line
            else _unbalanced_quote(text)
        )
        if problem:
            shown = text.encode("unicode_escape").decode()[:120]
            raise ConfigError(
                f"{key}={shown}: holds {problem}, and it is written into the batch script or a shell command; "
                "accepted: one line without NUL" + ("" if shell_line else ", its quotes balanced")
            )


def _leaves(prefix: str, tree: object) -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of a plain config tree; list items as key[i]."""
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    if isinstance(tree, list):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(f"{prefix}[{i}]", v)]
    return [(prefix, tree)]


def _unbalanced_quote(text: str) -> str | None:
    try:
        shlex.split(text)
    except ValueError:
        return "an unbalanced quote"
    return None


def launcher_retries(launcher: DictConfig) -> int:
    """hydra.launcher.retries: how many times a run that failed for its infrastructure is run again
    (0 for a launch profile that does not set it)."""
    retries = launcher.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(
            f"hydra.launcher.retries={retries}: must be a whole number >= 0 (how many times a run that "
            "failed for its node, network or GPU hardware is run again; 0: never)"
        )
    return retries
