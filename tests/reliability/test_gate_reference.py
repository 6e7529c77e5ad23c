"""A reference the gate cannot use is exit 2 with one line (1 is the gate's "regression"), read before
the sweep, so no MLflow store is opened or created; a reference with no runs or no checks is refused,
as it would pass while checking nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_errors

GOOD_RUN = {"tokens_per_s": 10.0, "loss": [[1, 2.5]]}


@pytest.mark.parametrize(
    "content, line",
    [
        (b"{not json", "not JSON text (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (
            b"\xff\xfe\x00binary",
            "not JSON text ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
        ),
        (b"[1, 2]", "a JSON list, not an object"),
        (json.dumps({"checks": ["tokens_per_s"]}).encode(), "runs=null: no combination to gate"),
        (json.dumps({"checks": ["tokens_per_s"], "runs": {}}).encode(), "runs={}: no combination to gate"),
        (json.dumps({"checks": [], "runs": {"a": GOOD_RUN}}).encode(), "checks=[]; accepted: a non-empty list of "),
        (json.dumps({"checks": "loss", "runs": {"a": GOOD_RUN}}).encode(), 'checks="loss"; accepted: '),
        (
            json.dumps({"checks": ["loss"], "runs": {"a": {"loss": "low"}}}).encode(),
            'runs[\'a\']={"loss": "low"}: expected a number for each checked metric',
        ),
        (
            json.dumps({"checks": ["tokens_per_s"], "runs": {"a": {"tokens_per_s": "fast"}}}).encode(),
            'runs[\'a\']={"tokens_per_s": "fast"}: expected a number',
        ),
        (
            json.dumps({"checks": ["loss"], "runs": {"a": GOOD_RUN}, "tolerances": {"loss": "5%"}}).encode(),
            'tolerances={"loss": "5%"}: expected numbers by metric',
        ),
    ],
    ids=[
        "bad json",
        "bytes",
        "a list",
        "no runs",
        "empty runs",
        "no checks",
        "checks not a list",
        "loss not pairs",
        "metric not a number",
        "tolerance not a number",
    ],
)
def test_a_malformed_reference_is_exit_2_with_one_line(tmp_path, content, line):
    reference = tmp_path / "reference.json"
    reference.write_bytes(content)
    proc = gate(tmp_path, "some-sweep", reference)
    assert proc.returncode == 2, proc.stderr
    [shown] = proc.stderr.strip().splitlines()
    assert shown.startswith(f"ghsweep.gate: --against {reference}: {line}"), shown
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists()


def test_a_directory_as_reference_is_exit_2_with_one_line(tmp_path):
    proc = gate(tmp_path, "some-sweep", tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"ghsweep.gate: --against {tmp_path}: a directory, not a file; record one with --write"
    )
    assert not (tmp_path / "mlflow.db").exists()


def gate(cwd, sweep, reference) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ghsweep.gate", sweep, "--against", str(reference)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
