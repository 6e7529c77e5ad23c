"""Redaction works on structure: a secret key's value inside a list or dict, the password of a tracking
URI's userinfo (in the console, MLflow's own 'View run at' line included, the run files, the server's
records, one-line errors and the dry run), and a short secret (`+db.password=2026`) that must not
rewrite the dates, job numbers and run directories that merely contain its text."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.mlflow_records import assert_nothing_running, by_role
from tests.support.sweep_dirs import only_sweep_dir, results

URI_PASSWORD = "uRiPa55-x9"
LIST_SECRET = "LiStSeCrEt-4r"
PG_PASSWORD = "pGpA55-t3"


@pytest.mark.parametrize(
    "given, shown",
    [
        ("+db.password=2026", "+db.password=***"),
        ("sweep 2026-11-25/10-00-00", "sweep 2026-11-25/10-00-00"),
        (
            "#0 : +db.password=0 precision=fp32 train.max_steps=0",
            "#0 : +db.password=*** precision=fp32 train.max_steps=0",
        ),
        ("+auth=[{password:abc,user:bob}]", "+auth=[{password:***,user:bob}]"),
        ("auth: [{'password': 'a b', 'user': 'bob'}]", "auth: [{'password': ***, 'user': 'bob'}]"),
        ('{"api_key": "k", "n": 1}', '{"api_key": ***, "n": 1}'),
        ("View run at: http://alice:PASS@h:5000/#/runs/1", "View run at: http://alice:***@h:5000/#/runs/1"),
        ("postgresql://bob:PASS@db:5432/x", "postgresql://bob:***@db:5432/x"),
        # The userinfo ends at the last @ before the host: a password holding @ is hidden whole.
        ("mysql://u:p@ssXYZ@host/db", "mysql://u:***@host/db"),
        ("uri=mysql://u:p@ss@h x@y", "uri=mysql://u:***@h x@y"),
        ("smtp://me@mail.org:pw@host/", "smtp://me@mail.org:***@host/"),
        (
            "+db.passwords=a accessToken: b {clientSecret: c} private_key=d pwd=e data.mean_tokens=210",
            "+db.passwords=*** accessToken: *** {clientSecret: ***} private_key=*** pwd=*** data.mean_tokens=210",
        ),
        (
            "http://alice@h:5000 password.file_path=/p tokens_per_s: 3",
            "http://alice@h:5000 password.file_path=/p tokens_per_s: 3",
        ),
        ("site:\n  credentials:\n    user: bob", "site:\n  credentials:\n    user: bob"),
    ],
)
def test_free_text_is_redacted_by_structure_only(given, shown):
    assert redact.text(given) == shown


def test_a_secret_inside_a_list_is_redacted_in_configs_and_overrides():
    tree = {"auth": [{"password": "x", "user": "bob"}, "plain"], "uri": "http://a:PASS@h", "n": 2026}
    assert redact.config(tree) == {
        "auth": [{"password": "***", "user": "bob"}, "plain"],
        "uri": "http://a:***@h",
        "n": 2026,
    }
    assert redact.override("+auth=[{password: x}]") == "+auth=[{password: ***}]"
    assert redact.override("+db.password=2026,0") == "+db.password=***"


@pytest.fixture(scope="module")
def credential_sweep(tmp_path_factory, mlflow_server):
    """A sweep into a real tracking server through a URI with a password, a list holding a secret key
    and short secrets whose text is in the date and the job numbers."""
    cwd = tmp_path_factory.mktemp("credentials")
    uri = mlflow_server.url.replace("http://", f"http://alice:{URI_PASSWORD}@")
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "precision=fp32,bf16",
            "train.max_steps=2",
            "train.seq_length=64",
            "tracking=server",
            f"tracking.uri={uri}",
            "tracking.experiment=credentials",
            f"+auth=[{{password: {LIST_SECRET}, user: bob}}]",
            "+db.password=2026",
            "+site.token=0",
        ],
        cwd,
    )
    return cwd, proc, MlflowStore(mlflow_server.url, "credentials")


def _holding(folder: Path, secrets: tuple[str, ...]) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and any(s.encode() in p.read_bytes() for s in secrets)
    )


def test_the_console_shows_no_uri_password_and_no_list_secret(credential_sweep):
    _, proc, _ = credential_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert URI_PASSWORD not in console and LIST_SECRET not in console
    assert "alice:***@" in console  # MLflow's own 'View run at' line and ours, the user kept
    assert "+db.password=*** +site.token=***" in console  # Hydra's launch line, by key
    assert "2 of 2 runs finished" in proc.stdout


def test_the_server_holds_no_secret_and_short_secrets_mangle_nothing(credential_sweep, tmp_path):
    cwd, _, store = credential_sweep
    sweep = only_sweep_dir(cwd)
    runs = store.search()
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    children = sorted(by_role(runs, "run"), key=lambda r: r.job_num)
    assert parent.name == "sweep " + "/".join(sweep.parts[-2:])  # the date and time whole, no ***
    assert parent.name.startswith("sweep 20")
    assert [c.job_num for c in children] == [0, 1]
    assert [c.run_dir for c in children] == [str(sweep / "0"), str(sweep / "1")]
    params = children[0].params
    assert params["db.password"] == "***" and params["site.token"] == "***"
    assert params["auth"] == "[{'password': '***', 'user': 'bob'}]"
    assert params["tracking.uri"].startswith("http://alice:***@127.0.0.1:")
    assert params["train.max_steps"] == "2" and params["seed"] != "***"
    for run in runs:
        texts = [run.name, *run.params.values(), *run.tags.values()]
        assert not [t for t in texts if URI_PASSWORD in t or LIST_SECRET in t], run.name
        store.download_artifacts(run.run_id, tmp_path / run.run_id)
    assert (tmp_path / children[0].run_id / "config.yaml").exists()
    assert _holding(tmp_path, (URI_PASSWORD, LIST_SECRET)) == []


def test_only_the_worker_config_and_the_manifest_hold_the_real_values(credential_sweep):
    cwd, _, _ = credential_sweep
    sweep = only_sweep_dir(cwd)
    assert {n: r["status"] for n, r in results(sweep).items()} == {0: "FINISHED", 1: "FINISHED"}
    # Hydra's own records (.hydra/, multirun.yaml) keep the command line as typed.
    holding = [p for p in _holding(sweep, (URI_PASSWORD, LIST_SECRET)) if ".hydra/" not in p and p != "multirun.yaml"]
    assert holding == ["0/config.yaml", "1/config.yaml", "ghsweep_sweep.json"]
    for name in holding:
        assert stat.S_IMODE((sweep / name).stat().st_mode) == 0o600, name
    assert URI_PASSWORD in json.loads((sweep / "ghsweep_sweep.json").read_text())["tracking_uri"]


def test_a_dry_run_shows_no_secret(tmp_path):
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "precision=fp32,bf16",
            "dry_run=true",
            f"tracking.uri=postgresql://bob:{PG_PASSWORD}@127.0.0.1:1/mlflow",
            f"+auth=[{{password: {LIST_SECRET}}}]",
            "+db.password=2026",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert PG_PASSWORD not in console and LIST_SECRET not in console
    assert "postgresql://bob:***@127.0.0.1:1/mlflow" in console and "+db.password=***" in console
    assert "#1 " in proc.stdout  # both combinations described
    assert not (tmp_path / "mlflow.db").exists()


def test_a_one_line_error_shows_no_uri_password(tmp_path):
    proc = run_cli(["experiment=smoke", f"tracking.uri=htp://bob:{PG_PASSWORD}@127.0.0.1:1/x"], tmp_path)
    assert proc.returncode == 1
    assert PG_PASSWORD not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("ghsweep: tracking.uri=htp://bob:***@127.0.0.1:1/x: ")
    assert_one_line_errors(proc.stdout, proc.stderr)
