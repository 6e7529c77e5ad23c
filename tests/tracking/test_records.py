"""The tag set of a combination's run, one for its job and for the sweep that records a job that died."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

from ghsweep.core.names import CODE_TAG, INPUTS_TAG, ROLE_RUN, ROLE_SWEEP
from ghsweep.tracking import records
from ghsweep.tracking.mlflow_store import MlflowStore

LOST = records.ChildRun("precision=bf16", "/sweep/0", ["precision=bf16", "note=a b"], 3, "h3", None)


def test_a_run_the_sweep_records_for_a_dead_job_has_the_job_s_tags_but_its_account_of_its_code():
    own = dataclasses.replace(LOST, git_commit="abc", code="ghsweep 1.0", input_digests={"data.path": "sha256:1"})
    own_tags, lost_tags = records.child_run_tags(own), records.child_run_tags(LOST)
    assert lost_tags == {
        "ghsweep.run_dir": "/sweep/0",
        "ghsweep.overrides": "precision=bf16 'note=a b'",
        "ghsweep.host": socket.gethostname(),
        "ghsweep.run_hash": "h3",
        "ghsweep.job_num": "3",
    }
    assert own_tags == {
        **lost_tags,
        records.GIT_COMMIT_TAG: "abc",
        CODE_TAG: "ghsweep 1.0",
        INPUTS_TAG: json.dumps({"data.path": "sha256:1"}),
    }


def test_a_child_run_starts_under_its_sweep_run_with_its_tags(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "records")
    parent = store.start_run("sweep s", ROLE_SWEEP, {})
    run_id = records.start_child_run(store, dataclasses.replace(LOST, parent_run_id=parent))
    [child] = store.search(role=ROLE_RUN, parent_run_id=parent)
    assert (child.run_id, child.name, child.status) == (run_id, "precision=bf16", "RUNNING")
    assert records.child_run_tags(LOST).items() <= child.tags.items()
