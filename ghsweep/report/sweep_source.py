"""A sweep as MLflow holds it: the parent run, its children, their metrics and profile analyses.

Everything the comparison shows is read back from MLflow (not from the jobs' in-memory results),
so `python -m ghsweep.report` rebuilds the same report later, on another machine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ghsweep.core.errors import SweepNotFound
from ghsweep.core.names import (
    ATTEMPTS_TAG,
    CONTENDED_TAG,
    ERROR_TAG,
    FAILURE_CLASS_TAG,
    ROLE_SWEEP,
    ROLE_TAG,
    RUN_IDS_TAG,
    attempt_tag,
)
from ghsweep.core.run_dir import PROFILE_ANALYSIS
from ghsweep.core.run_result import RunStatus
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.report.sweep_table import knob_values
from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun

# Where a job logs its profile's files, the analysis (`python -m ghsweep.analyze --json`) among them.
PROFILE_ARTIFACTS = "profile"
SWEEP_NAME_PREFIX = "sweep "
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
# Knobs whose run records whether it applied them (ghsweep.train.summary_builder): the value that asks for the
# effect, and the tag that is "False" where the device could not apply it.
APPLIED_TAGS = {"offload": ("on", "ghsweep.offload_applied")}


@dataclass
class SweepRun:
    run_id: str
    name: str
    job_num: int | None
    status: str
    overrides: list[str]
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    loss: list[tuple[int, float]] = field(default_factory=list)
    analysis: ProfileAnalysis | None = None

    @property
    def error(self) -> str | None:
        return self.tags.get(ERROR_TAG)

    @property
    def contended(self) -> str | None:
        """Why its numbers are the machine's as much as its knobs' (measured on a busy machine)."""
        return self.tags.get(CONTENDED_TAG)

    @property
    def failure(self) -> str:
        """Why the run did not finish, after its class (deterministic or infrastructure) where recorded."""
        failure_class = self.tags.get(FAILURE_CLASS_TAG)
        return (f"{failure_class}: " if failure_class else "") + (self.error or "no reason recorded")

    @property
    def retried(self) -> list[str]:
        """Why each earlier attempt of the run failed (infrastructure failures run again), in order."""
        return [self.tags[attempt_tag(n)] for n in range(1, int(self.tags.get(ATTEMPTS_TAG, 1)))]

    @property
    def finished(self) -> bool:
        return self.status == RunStatus.FINISHED

    @property
    def knobs(self) -> dict[str, str]:
        return knob_values(self.overrides)

    @property
    def shown_knobs(self) -> dict[str, str]:
        """The knobs as tables show them: a value the run could not apply marked `(no effect here)`
        (offload=on on a CPU), so its row's numbers are not read as the knob's."""
        return {
            knob: f"{value} (no effect here)" if (value, "False") == self._applied(knob) else value
            for knob, value in self.knobs.items()
        }

    @property
    def knobs_in_effect(self) -> dict[str, str | None]:
        """The knobs as the training saw them: None for a knob whose value was not applied, or asks
        for no effect (offload=on on a CPU and offload=off both train without offload)."""
        effective: dict[str, str | None] = {}
        for knob, value in self.knobs.items():
            applied = self._applied(knob)
            effective[knob] = None if applied is not None and applied != (value, "True") else value
        return effective

    def _applied(self, knob: str) -> tuple[str, str] | None:
        """(the value that asks for the knob's effect, whether the run recorded it applied), if recorded."""
        if knob not in APPLIED_TAGS:
            return None
        asking, tag = APPLIED_TAGS[knob]
        return asking, self.tags.get(tag, "")


def find_run(store: MlflowStore, ref: str, role: str) -> StoredRun:
    """The run with id `ref`, or the newest run named `ref` with tag ghsweep.role=`role`.

    A sweep may be named with or without its "sweep " prefix ("2026-11-21/01-49-38").
    """
    if RUN_ID.match(ref):
        run = store.get_run(ref)
        if run.role != role:
            raise SweepNotFound(f"run {ref} is a ghsweep {run.role or 'non-ghsweep'} run, not a {role} run")
        return run
    names = {ref, SWEEP_NAME_PREFIX + ref} if role == ROLE_SWEEP else {ref}
    candidates = store.search(role=role, limit=1000)
    for run in candidates:
        if run.name in names:
            return run
    newest = ", ".join(repr(r.name) for r in candidates[:5]) or "none"
    raise SweepNotFound(
        f"{ref!r}: no run of that name or id with tag {ROLE_TAG}={role} in {store.tracking_uri}; "
        f"newest {role} runs there: {newest}"
    )


def load_run(store: MlflowStore, run: StoredRun) -> SweepRun:
    return SweepRun(
        run_id=run.run_id,
        name=run.name,
        job_num=run.job_num,
        status=run.status,
        overrides=run.overrides,
        params=run.params,
        metrics=run.metrics,
        tags=run.tags,
        loss=store.metric_history(run.run_id, "loss"),
        analysis=load_analysis(store, run.run_id),
    )


def load_sweep(store: MlflowStore, parent: StoredRun) -> list[SweepRun]:
    """The sweep's runs in job order.

    The runs the parent lists (tag ghsweep.run_ids, written at the sweep's end) in that order: they
    include runs a resumed sweep reused from an earlier one. Otherwise the parent's children by job
    number (start time where a job number is missing).
    """
    listed = parent.tags.get(RUN_IDS_TAG)
    if listed:
        runs = [load_run(store, store.get_run(run_id)) for run_id in listed.split(",")]
        for job_num, run in enumerate(runs):
            run.job_num = job_num  # a reused run's own tag holds its number in the earlier sweep
        return runs
    children = store.search(parent_run_id=parent.run_id)
    runs = [load_run(store, c) for c in children]
    start = {c.run_id: c.start_time for c in children}
    return sorted(runs, key=lambda r: (r.job_num is None, r.job_num or 0, start[r.run_id]))


def load_analysis(store: MlflowStore, run_id: str) -> ProfileAnalysis | None:
    wanted = f"{PROFILE_ARTIFACTS}/{PROFILE_ANALYSIS}"
    text = store.artifact_text(run_id, wanted)
    return ProfileAnalysis.from_dict(json.loads(text), f"run {run_id}: {wanted}") if text is not None else None
