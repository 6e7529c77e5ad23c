"""One combination of a sweep (or the one run), as Hydra composed it: the submitit launcher reads it
from the config it composes before submitting the job, and the job from Hydra's config of the job it
runs; both from the config's `hydra` node, so the two agree on its name, run directory and overrides."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode

from ghsweep.config.validate import launcher_retries
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.tracking import redact

# Config groups recorded as plain params (e.g. precision=bf16) beside the flattened config.
KNOB_GROUPS = ("peft", "precision", "offload", "memory", "dataloader", "model", "data", "backend", "profile")


@dataclass(frozen=True)
class Combination:
    """One combination, as Hydra composed it."""

    name: str  # the MLflow run name: the overrides, secrets redacted
    run_dir: Path
    overrides: list[str]  # what records and the console show; the worker gets the real values (config.yaml)
    num: int  # the job's number in the sweep (0 outside one)
    in_sweep: bool
    sweep_dir: Path
    choices: dict[str, str]  # the option chosen in each knob group
    launcher: str
    cwd: str
    retries: int = 0  # hydra.launcher.retries: runs again after an infrastructure failure

    @classmethod
    def of(cls, hydra_cfg: HydraConf, run_dir: Path, overrides: list[str], in_sweep: bool) -> Combination:
        """The combination whose config's `hydra` node is `hydra_cfg` (the launcher's composed config's,
        or the job's HydraConfig), composed from `overrides` (the real values), run in `run_dir`."""
        return cls(
            name=redact.run_name(hydra_cfg.job.override_dirname or "run"),
            run_dir=run_dir,
            overrides=redact.overrides(overrides),
            num=hydra_cfg.job.num if in_sweep else 0,
            in_sweep=in_sweep,
            sweep_dir=Path(hydra_cfg.sweep.dir),
            choices={k: v for k, v in hydra_cfg.runtime.choices.items() if k in KNOB_GROUPS},
            launcher=str(hydra_cfg.runtime.choices.get("hydra/launcher")),
            cwd=hydra_cfg.runtime.cwd,
            retries=launcher_retries(hydra_cfg.launcher),
        )

    def result(self, status: RunStatus, mlflow_run_id: str | None = None) -> RunResult:
        return RunResult(
            name=self.name,
            run_dir=str(self.run_dir),
            overrides=self.overrides,
            status=status,
            mlflow_run_id=mlflow_run_id,
        )


def this_combination() -> Combination:
    """The combination Hydra runs this job for, its run directory made."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    redact.install_log_redaction()  # a SLURM job's process starts here, not in ghsweep.__main__
    return Combination.of(hydra_cfg, run_dir, list(hydra_cfg.overrides.task), hydra_cfg.mode == RunMode.MULTIRUN)


def override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def fixed_keys(command: str) -> set[str]:
    """The keys a sweep's command (`python -m ghsweep -m ...`) gives one value for every combination."""
    words = [w for w in shlex.split(command)[3:] if "=" in w and not w.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(words)
    except HydraException:  # a value the manifest shows redacted, or quoted another way: name them all
        return set()
    return {override_key(word) for word, override in zip(words, parsed) if not override.is_sweep_override()}


def run_name(combo: Combination, command: str | None) -> str:
    """A combination's MLflow run name: the knobs its sweep varies (`precision=fp8 offload=on`), not
    those every combination shares, which the UI would show first and cut the rest off; outside a
    sweep, or where nothing varies, its overrides."""
    fixed = fixed_keys(command) if command else set()
    varied = [o for o in combo.overrides if override_key(o) not in fixed and not override_key(o).startswith("hydra")]
    return redact.run_name(" ".join(varied)) if command and varied else combo.name
