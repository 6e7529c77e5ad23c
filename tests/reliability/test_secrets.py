"""Secrets given on the command line or through an environment variable reach the worker and no
record: not MLflow (params, tags, run names, artifacts, its database file), not the run directory's
records, not the console. Environment variables are never logged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ghsweep.tracking import redact
from ghsweep.tracking.mlflow_store import MlflowStore
from tests.support.cli import run_cli
from tests.support.mlflow_records import all_runs, assert_nothing_running, sqlite_uri
from tests.support.sweep_dirs import only_sweep_dir

PASSWORD = "hunter2-q7Zx"
TOKEN_IN_ENV = "tok-from-env-5kV3"  # reaches the config through an oc.env interpolation
HF_TOKEN = "hf-env-only-9wQp"  # an environment variable no config names
SHELL_VALUE = "$(touch PWNED); `touch PWNED2` | rm -rf x && echo done"
# Secrets under the usual spellings of their keys, and a URI password holding an @.
SPELLED = {
    "+db.passwords": "pLuRaL-1a",
    "+x.accessToken": "cAmEl-2b",
    "+x.clientSecret": "cAmEl-3c",
    "+ssh.private_key": "pRiVaTe-4d",
    "+db.pwd": "pWd-5e",
    "+gpg.passphrase": "pHrAsE-6f",
}
URI_PASSWORD_TAIL = "aT-hOsT-7g"  # mysql://u:p@aT-hOsT-7g@host/db: all of `p@aT-hOsT-7g` is the password


@pytest.mark.parametrize(
    "key, secret",
    [
        ("tracking.password", True),
        ("model.hf_token", True),
        ("container.env.AWS_SECRET_ACCESS_KEY", True),
        ("db.api_key", True),
        ("site.credentials", True),
        ("x.apiKey", True),
        ("x.Password", True),
        ("x.client-secret", True),
        ("db.passwords", True),
        ("x.accessToken", True),
        ("x.clientSecret", True),
        ("x.APIKey", True),
        ("ssh.private_key", True),
        ("db.pwd", True),
        ("gpg.passphrase", True),
        ("s3.access_keys", True),
        ("data.mean_tokens", False),  # tokens counted, not a token
        ("x.num_keys", False),
        ("container.env.TOKENIZERS_PARALLELISM", False),
        ("metrics.tokens_per_s", False),
        ("peft.r", False),
        ("password.file_path", False),  # only the last part of a key counts
        ("model.config.bos_token_id", False),  # an id names a token, it is no secret
        ("pad_token_ids", False),
    ],
)
def test_which_keys_are_secret(key, secret):
    assert redact.is_secret_key(key) is secret


def test_overrides_and_params_are_redacted_by_key():
    assert redact.override("+tracking.password=abc") == "+tracking.password=***"
    assert redact.override("++db.api_key=x,y") == "++db.api_key=***"
    assert redact.override("precision=bf16") == "precision=bf16"
    assert redact.params({"a.token": "t", "peft.r": "16"}) == {"a.token": "***", "peft.r": "16"}


@pytest.fixture(scope="module")
def secret_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("secrets")
    env_before = dict(os.environ)
    os.environ.update(GHSWEEP_TEST_TOKEN=TOKEN_IN_ENV, HF_TOKEN=HF_TOKEN)
    try:
        proc = run_cli(
            [
                "-m",
                "experiment=smoke",
                "precision=fp32",
                "train.max_steps=2",
                f"+tracking.password={PASSWORD}",
                "+model.hf_token=${oc.env:GHSWEEP_TEST_TOKEN}",
                f"+notes.shell='{SHELL_VALUE}'",
                *(f"{key}={value}" for key, value in SPELLED.items()),
                f"+db.uri=mysql://u:p@{URI_PASSWORD_TAIL}@host/db",
            ],
            cwd,
        )
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return cwd, proc


SECRETS = (PASSWORD, TOKEN_IN_ENV, HF_TOKEN, *SPELLED.values(), URI_PASSWORD_TAIL)


def _holding_a_secret(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS)]


def test_the_sweep_runs_and_the_console_shows_no_secret(secret_sweep):
    cwd, proc = secret_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in SECRETS:
        assert secret not in proc.stdout + proc.stderr
    assert "+tracking.password=***" in proc.stdout  # Hydra's launch line, redacted as it was logged


def test_mlflow_holds_no_secret_anywhere(secret_sweep, tmp_path):
    cwd, _ = secret_sweep
    uri = sqlite_uri(cwd)
    runs = all_runs(uri)
    assert len(runs) == 2
    assert_nothing_running(runs)
    store = MlflowStore(uri, experiment=None)
    child = next(r for r in runs if r.tags["ghsweep.role"] == "run")
    assert child.params["tracking.password"] == "***" and child.params["model.hf_token"] == "***"
    assert child.params["notes.shell"] == SHELL_VALUE  # a value, never run by a shell
    assert {key: child.params[key.lstrip("+")] for key in SPELLED} == dict.fromkeys(SPELLED, "***")
    assert child.params["db.uri"] == "mysql://u:***@host/db"
    for run in runs:
        texts = [run.name, *run.params.values(), *run.tags.values()]
        assert not [t for t in texts for s in SECRETS if s in t], run.name
        store.download_artifacts(run.run_id, tmp_path / run.run_id)
    assert (tmp_path / child.run_id / "config.yaml").exists()
    assert _holding_a_secret(tmp_path) == []
    # Every byte MLflow stored: the database and its artifact store.
    assert _holding_a_secret(cwd / "mlruns") == []
    assert not any(s.encode() in (cwd / "mlflow.db").read_bytes() for s in SECRETS)


def test_the_worker_gets_the_real_values_and_only_its_config_holds_them(secret_sweep):
    cwd, _ = secret_sweep
    run_dir = only_sweep_dir(cwd) / "0"
    config = run_dir / "config.yaml"
    assert f"password: {PASSWORD}" in config.read_text() and f"hf_token: {TOKEN_IN_ENV}" in config.read_text()
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # Hydra's own records keep the command line as typed: the interpolation, not the token.
    records = [
        p
        for p in _holding_a_secret(cwd / "multirun")
        if Path(p).name not in ("multirun.yaml",) and "/.hydra/" not in p and p != str(config)
    ]
    assert records == []
    assert TOKEN_IN_ENV not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not any(
        HF_TOKEN in p.read_text(errors="replace") for p in cwd.rglob("*") if p.is_file() and p.suffix != ".db"
    )


def test_shell_metacharacters_in_a_value_run_nothing(secret_sweep):
    cwd, _ = secret_sweep
    assert not list(cwd.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
