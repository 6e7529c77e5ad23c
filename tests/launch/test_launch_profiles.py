"""Launch profiles carry their site's MLflow tracking server (tracking.server_uri): composed with the
real config (Hydra's compose API and the CLI), and a real sweep through a site profile that logs
its parent run and its runs to a real tracking server with no tracking flags."""

from __future__ import annotations

import json

import pytest
import yaml

from ghsweep.core.run_dir import SWEEP_MANIFEST
from tests.support.cli import run_cli
from tests.support.compose import compose_config
from tests.support.mlflow_records import MlflowRecords

GH200_SERVER = "http://login-node:5000"


def tracking_of(*overrides: str) -> tuple[str, str]:
    """(the tracking group's choice, the resolved tracking.uri) of the composed config."""
    cfg = compose_config(*overrides, hydra=True)
    return cfg.hydra.runtime.choices.tracking, cfg.tracking.uri


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ((), ("auto", "sqlite:///mlflow.db")),
        (("hydra/launcher=local",), ("auto", "sqlite:///mlflow.db")),
        (("hydra/launcher=submitit_local",), ("auto", "sqlite:///mlflow.db")),
        (("hydra/launcher=gh200",), ("auto", GH200_SERVER)),
        (("hydra/launcher=gh200", "experiment=smoke"), ("auto", GH200_SERVER)),
        (("hydra/launcher=local_slurm",), ("auto", "http://127.0.0.1:5000")),
        # The command line beats the profile: one URI, the profile's key, or another tracking option.
        (("hydra/launcher=gh200", "tracking.uri=http://other:5000"), ("auto", "http://other:5000")),
        (("hydra/launcher=gh200", "tracking.server_uri=http://other:5000"), ("auto", "http://other:5000")),
        (("hydra/launcher=gh200", "tracking=sqlite"), ("sqlite", "sqlite:///mlflow.db")),
        (("hydra/launcher=gh200", "tracking=server"), ("server", GH200_SERVER)),
        (("tracking=server",), ("server", "http://127.0.0.1:5000")),
        (("tracking=server", "tracking.uri=http://other:5000"), ("server", "http://other:5000")),
    ],
)
def test_tracking_uri_of_launch_profiles_and_the_command_line(overrides, expected):
    assert tracking_of(*overrides) == expected


def test_cfg_job_and_hydra_show_the_profiles_tracking_server(tmp_path):
    job = run_cli(["hydra/launcher=gh200", "--cfg", "job", "--resolve", "--package", "tracking"], tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert yaml.safe_load(job.stdout) == {"server_uri": GH200_SERVER, "uri": GH200_SERVER, "experiment": "ghsweep"}
    hydra = run_cli(["hydra/launcher=gh200", "--cfg", "hydra", "--package", "hydra.runtime.choices"], tmp_path)
    assert hydra.returncode == 0, hydra.stderr[-3000:]
    choices = yaml.safe_load(hydra.stdout)
    assert choices["tracking"] == "auto" and choices["hydra/launcher"] == "gh200"


SITE_PROFILE = """\
# @package _global_
defaults:
  - /hydra/launcher/basic@hydra.launcher
  - /container@container: none

tracking:
  server_uri: {url}
"""


def test_sweep_through_a_site_profile_logs_to_its_tracking_server(mlflow_server, tmp_path):
    """A site profile (launchers/<site>.yaml, here on Hydra's search path) names its server; the sweep
    runs with no tracking flag, and its parent run (made by the submitting side) and its run (made by
    the job, from the sweep manifest) both land on that server."""
    site = tmp_path / "site_conf"
    (site / "hydra" / "launcher").mkdir(parents=True)
    (site / "hydra" / "launcher" / "site.yaml").write_text(SITE_PROFILE.format(url=mlflow_server.url))
    experiment = "site_profile"
    proc = run_cli(
        [
            "-m",
            f"hydra.searchpath=[file://{site}]",
            "hydra/launcher=site",
            "experiment=smoke",
            "precision=fp32",
            "train.max_steps=2",
            f"tracking.experiment={experiment}",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    manifest = json.loads((tmp_path / "sweep" / SWEEP_MANIFEST).read_text())
    assert manifest["tracking_uri"] == mlflow_server.url
    records = MlflowRecords(mlflow_server.url, experiment)
    (parent,) = records.runs("sweep")
    (child,) = records.runs("run")
    assert parent.info.run_id == manifest["parent_run_id"] and parent.info.status == "FINISHED"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
    assert child.data.params["tracking.uri"] == mlflow_server.url
    assert not (tmp_path / "mlflow.db").exists()  # nothing went to the default SQLite store
