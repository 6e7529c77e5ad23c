"""Run identity and resume: a combination that already FINISHED in MLflow as the same run is skipped.

The identity is a hash of the resolved config without the keys that only say how or where to launch
or record a run, so the same combination in a new sweep (new directory, new timestamp) has the same
hash, and of what decides the result beyond the config (launch.provenance): the code, and the
content of the input files the run reads. `force=true` reruns everything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ghsweep.core.names import CODE_TAG, INPUTS_TAG, ROLE_RUN, RUN_HASH_TAG
from ghsweep.core.run_result import WORKER_PARTS, RunResult, RunStatus
from ghsweep.launch.provenance import code_version, input_digests
from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun

log = logging.getLogger(__name__)

# Keys that do not change what a run trains or measures.
# `tune`: the settings of a tuning study (hydra/sweeper=tune), not of its runs.
# `worker`: how long a worker may run, not what it trains.
NOT_IDENTITY = ("hydra", "dry_run", "force", "wait", "tracking", "report", "tune", "worker")
# The metrics of a run that are its timing (RunResult.timing), not its measurements.
TIMING = (
    "startup_s",
    "setup_s",
    "train_s",
    *WORKER_PARTS,
    "worker_exit_s",
    "analysis_s",
    "record_s",
    "wall_s",
    "overhead_s",
)


def identity_overrides(overrides: list[str]) -> list[str]:
    """The overrides that change what a run trains: those of NOT_IDENTITY keys left out."""
    return [o for o in overrides if o.lstrip("+~").split("=")[0].split(".")[0].split("/")[0] not in NOT_IDENTITY]


def run_hash(cfg: DictConfig) -> str:
    """A short stable hash of the resolved config (launch and tracking keys left out), the code and the
    input files' contents."""
    # Key by key: the hydra node of a launcher-side config does not resolve outside a job.
    config = {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
        for k in cfg
        if k not in NOT_IDENTITY
    }
    identity = {"config": config, CODE_TAG: code_version(), INPUTS_TAG: input_digests(cfg)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def why_it_matches(run: StoredRun) -> str:
    """What the earlier run and this one share, in words: the config, the code, the inputs."""
    inputs = json.loads(run.tags.get(INPUTS_TAG) or "{}")
    files = "; ".join(f"{key} {digest[:19]}" for key, digest in inputs.items())
    return f"the same config, code ({run.tags.get(CODE_TAG, 'unknown')})" + (
        f" and input files ({files})" if files else " and no input files"
    )


def finished_run(store: MlflowStore, identity: str) -> StoredRun | None:
    """The latest FINISHED child run with this identity in the store's experiment, if any."""
    runs = store.search(role=ROLE_RUN, status=RunStatus.FINISHED, tags={RUN_HASH_TAG: identity}, limit=1)
    return runs[0] if runs else None


def result_from_run(run: StoredRun) -> RunResult:
    """A run's result as MLflow recorded it."""
    return RunResult(
        name=run.name,
        run_dir=run.run_dir,
        overrides=run.overrides,
        status=RunStatus(run.status),
        error=run.error,
        metrics={k: v for k, v in run.metrics.items() if k not in TIMING},
        timing={k: v for k, v in run.metrics.items() if k in TIMING},
        mlflow_run_id=run.run_id,
    )


def skip_finished(run: StoredRun, name: str, run_dir: Path, overrides: list[str]) -> RunResult:
    """Write this combination's result.json from the earlier run instead of training again; into a run
    directory that is a symbolic link nothing is written (a sweep writes only into directories it
    makes), and the result is returned alone."""
    result = dataclasses.replace(
        result_from_run(run), name=name, run_dir=str(run_dir), overrides=overrides, reused=True
    )
    if run_dir.is_symlink():
        log.warning("%s: the run directory %s is a symbolic link; its result.json is not written", name, run_dir)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        result.save()
    log.info(
        "%s: skipped, already FINISHED in MLflow run %s with %s (force=true reruns it)",
        name,
        run.run_id,
        why_it_matches(run),
    )
    return result
