"""A reference the gate cannot use is exit 2 with one line (1 is the gate's "regression"), read before
the sweep, so no MLflow store is opened or created; a reference with no runs or no checks is refused,
as it would pass while checking nothing."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_one_line_errors
from tests.support.gate import gate, gate_cli

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
            'runs[\'a\']={"loss": "low"}: expected a finite number for each checked metric',
        ),
        (
            json.dumps({"checks": ["tokens_per_s"], "runs": {"a": {"tokens_per_s": "fast"}}}).encode(),
            'runs[\'a\']={"tokens_per_s": "fast"}: expected a finite number',
        ),
        (
            json.dumps({"checks": ["loss"], "runs": {"a": GOOD_RUN}, "tolerances": {"loss": "5%"}}).encode(),
            'tolerances={"loss": "5%"}: expected a fraction (at least 0, below 1) by metric',
        ),
        # JSON's NaN and Infinity compare false with everything: a gate on them would always pass.
        (b'{"checks": ["tokens_per_s"], "runs": {"a": {"tokens_per_s": NaN}}}', "runs['a']={\"tokens_per_s\": NaN}"),
        (b'{"checks": ["loss"], "runs": {"a": {"loss": [[1, Infinity]]}}}', "runs['a']={\"loss\": [[1, Infinity]]}"),
        (
            b'{"checks": ["tokens_per_s"], "runs": {"a": {"tokens_per_s": 1}}, "tolerances": {"tokens_per_s": NaN}}',
            'tolerances={"tokens_per_s": NaN}: expected a fraction',
        ),
        (
            b'{"checks": ["tokens_per_s"], "runs": {"a": {"tokens_per_s": 1}}, "noise_pct": {"a": {"tokens_per_s": NaN}}}',
            'noise_pct={"a": {"tokens_per_s": NaN}}: expected the half-width',
        ),
        (
            json.dumps({"checks": ["tokens_per_s"], "runs": {"a": GOOD_RUN}, "noise_pct": {"a": "wide"}}).encode(),
            'noise_pct={"a": "wide"}: expected the half-width (%, a finite number >= 0) of each metric by combination',
        ),
        (
            json.dumps({"checks": ["tokens_per_s"], "runs": {"a": {}}}).encode(),
            "runs['a']={}: expected a finite number",
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
        "NaN value",
        "infinite loss",
        "NaN tolerance",
        "NaN noise",
        "noise not numbers",
        "a run with no values",
    ],
)
def test_a_malformed_reference_is_exit_2_with_one_line(tmp_path, content, line):
    assert_refused(gate, tmp_path, content, line)


def test_a_malformed_reference_is_one_line_from_the_cli(tmp_path):
    assert_refused(gate_cli, tmp_path, b"[1, 2]", "a JSON list, not an object")


def assert_refused(run, tmp_path, content: bytes, line: str) -> None:
    reference = tmp_path / "reference.json"
    reference.write_bytes(content)
    proc = run(tmp_path, "some-sweep", "--against", reference)
    assert proc.returncode == 2, proc.stderr
    [shown] = proc.stderr.strip().splitlines()
    assert shown.startswith(f"ghsweep.gate: --against {reference}: {line}"), shown
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists()


def test_a_directory_as_reference_is_exit_2_with_one_line(tmp_path):
    proc = gate(tmp_path, "some-sweep", "--against", tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"ghsweep.gate: --against {tmp_path}: a directory, not a file; record one with --write"
    )
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (["--write", "--checks", ","], "ghsweep.gate: --checks ',': no check named; accepted: a comma-separated list"),
        (["--checks", " , "], "ghsweep.gate: --checks ' , ': no check named"),
        (["--tolerance", "nan"], "ghsweep.gate: argument --tolerance: 'nan': must be at least 0% and below 100%"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(tmp_path, args, line):
    assert_bad_arguments_refused(gate, tmp_path, args, line)


def test_a_bad_argument_is_one_line_from_the_cli(tmp_path):
    assert_bad_arguments_refused(gate_cli, tmp_path, ["--tolerance", "nan"], "ghsweep.gate: argument --tolerance: ")


def assert_bad_arguments_refused(run, tmp_path, args: list[str], line: str) -> None:
    proc = run(tmp_path, "some-sweep", "--against", "ref.json", *args)
    assert proc.returncode == 2
    [shown] = proc.stderr.strip().splitlines()
    assert shown.startswith(line), shown
    assert not (tmp_path / "ref.json").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("target, what", [("folder", "a directory"), ("file/ref.json", "file is a file, not a folder")])
def test_write_where_no_reference_can_be_is_one_line(tmp_path, target, what):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    proc = gate(tmp_path, "some-sweep", "--against", target, "--write")
    assert proc.returncode == 2
    [shown] = proc.stderr.strip().splitlines()
    assert shown.startswith(f"ghsweep.gate: --write --against {target}: {what}"), shown
    assert not (tmp_path / "mlflow.db").exists()  # refused before any store was opened


def test_write_where_no_reference_can_be_is_one_line_from_the_cli(tmp_path):
    (tmp_path / "folder").mkdir()
    proc = gate_cli(tmp_path, "some-sweep", "--against", "folder", "--write")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "ghsweep.gate: --write --against folder: a directory; name the reference file to write"
    )
