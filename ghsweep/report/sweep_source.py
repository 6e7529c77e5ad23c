"""A sweep as MLflow holds it: the parent run, its children, their metrics and profile analyses.

Everything the comparison shows is read back from MLflow (not from the jobs' in-memory results),
so `python -m ghsweep.report` rebuilds the same report later, on another machine.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from ghsweep.core.run_dir import PROFILE_ANALYSIS
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.core.errors import SweepNotFound

# A progress bar per downloaded analysis would bury the report's own output (MLflow reads it per download).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# Where a job logs its profile's files, the analysis (`python -m ghsweep.analyze --json`) among them.
PROFILE_ARTIFACTS = "profile"
SWEEP_NAME_PREFIX = "sweep "
# On a sweep's parent run: its runs' ids in job order, comma-separated.
RUN_IDS_TAG = "ghsweep.run_ids"
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


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
        return self.tags.get("ghsweep.error")

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def knobs(self) -> dict[str, str]:
        return dict(o.partition("=")[::2] for o in self.overrides)


def find_run(client: MlflowClient, ref: str, role: str) -> Run:
    """The run with id `ref`, or the newest run named `ref` with tag ghsweep.role=`role`.

    A sweep may be named with or without its "sweep " prefix ("2026-11-21/01-49-38").
    """
    if RUN_ID.match(ref):
        run = client.get_run(ref)
        found_role = run.data.tags.get("ghsweep.role")
        if found_role != role:
            raise SweepNotFound(f"run {ref} is a ghsweep {found_role or 'non-ghsweep'} run, not a {role} run")
        return run
    names = {ref, SWEEP_NAME_PREFIX + ref} if role == "sweep" else {ref}
    experiments = [e.experiment_id for e in client.search_experiments()]
    candidates = client.search_runs(experiments, filter_string=f"tags.`ghsweep.role` = '{role}'",
                                    order_by=["attributes.start_time DESC"], max_results=1000)
    for run in candidates:
        if run.info.run_name in names:
            return run
    newest = ", ".join(repr(r.info.run_name) for r in candidates[:5]) or "none"
    raise SweepNotFound(f"{ref!r}: no run of that name or id with tag ghsweep.role={role} in {client.tracking_uri}; "
                        f"newest {role} runs there: {newest}")


def load_run(client: MlflowClient, run: Run) -> SweepRun:
    tags = run.data.tags
    job_num = tags.get("ghsweep.job_num")
    overrides = tags.get("ghsweep.overrides", "")
    history = client.get_metric_history(run.info.run_id, "loss")
    return SweepRun(
        run_id=run.info.run_id,
        name=run.info.run_name,
        job_num=int(job_num) if job_num is not None and job_num.isdigit() else None,
        status=run.info.status,
        overrides=overrides.split(" ") if overrides else [],
        params=dict(run.data.params),
        metrics=dict(run.data.metrics),
        tags=dict(tags),
        loss=sorted((m.step, m.value) for m in history),
        analysis=load_analysis(client, run.info.run_id),
    )


def load_sweep(client: MlflowClient, parent: Run) -> list[SweepRun]:
    """The sweep's runs in job order.

    The runs the parent lists (tag ghsweep.run_ids, written at the sweep's end) in that order: they
    include runs a resumed sweep reused from an earlier one. Otherwise the parent's children by job
    number (start time where a job number is missing).
    """
    listed = parent.data.tags.get(RUN_IDS_TAG)
    if listed:
        runs = [load_run(client, client.get_run(run_id)) for run_id in listed.split(",")]
        for job_num, run in enumerate(runs):
            run.job_num = job_num  # a reused run's own tag holds its number in the earlier sweep
        return runs
    children: list[Run] = []
    token = None
    while True:
        page = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                                  max_results=1000, page_token=token)
        children += page
        token = page.token
        if not token:
            break
    runs = [load_run(client, c) for c in children]
    start = {c.info.run_id: c.info.start_time for c in children}
    return sorted(runs, key=lambda r: (r.job_num is None, r.job_num or 0, start[r.run_id]))


def load_analysis(client: MlflowClient, run_id: str) -> ProfileAnalysis | None:
    wanted = f"{PROFILE_ARTIFACTS}/{PROFILE_ANALYSIS}"
    if wanted not in {a.path for a in client.list_artifacts(run_id, PROFILE_ARTIFACTS)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        raw = json.loads(Path(client.download_artifacts(run_id, wanted, tmp)).read_text())
    return ProfileAnalysis.from_dict(raw, f"run {run_id}: {wanted}")
