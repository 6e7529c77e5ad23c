"""Every kind of bad value the config groups accept: a value no node can run is refused before anything
is recorded, one line per refused combination naming the key and the value, every combination at once
(checked in this process by the code the CLI calls; one real CLI run per way a refusal reaches the
terminal). A value only the node can judge (device=cuda) is refused there: that run is recorded FAILED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghsweep.__main__ import check_overrides
from ghsweep.launch.callbacks import check_launch
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.compose import hydra_on_conf, launch_config, refused_combinations
from tests.support.mlflow_records import all_runs, assert_nothing_running, by_role, sqlite_uri
from tests.support.sweep_dirs import only_sweep_dir, results

DOLLY = {"instruction": "Say hi.", "context": "", "response": "hi", "category": "open_qa"}


def data_files(folder: Path) -> dict[str, Path]:
    names = ("not_json", "empty", "huge_line", "no_response", "array", "number_field", "null_field")
    files = {name: folder / f"{name}.jsonl" for name in names}
    files["not_json"].write_text(json.dumps(DOLLY) + "\n{'instruction': 'single quotes'}\n")
    files["empty"].write_text("\n\n")
    files["huge_line"].write_bytes(b'{"instruction": "' + b"a" * (50 << 20) + b'", "response": "x"}\n')
    files["no_response"].write_text(json.dumps({"instruction": "Say hi."}) + "\n")
    files["array"].write_text(json.dumps([DOLLY, DOLLY]) + "\n")
    files["number_field"].write_text(json.dumps(DOLLY) + "\n" + json.dumps({**DOLLY, "instruction": 123}) + "\n")
    files["null_field"].write_text(json.dumps({**DOLLY, "response": None}) + "\n")
    return files


def model_folder(folder: Path) -> Path:
    (folder / "no_config").mkdir()
    (folder / "list_config").mkdir()
    (folder / "list_config" / "config.json").write_text("[1, 2]")
    (folder / "null_layers").mkdir()
    (folder / "null_layers" / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": None, "max_position_embeddings": 4096})
    )
    return folder / "no_config"


# (the sweep's overrides, the one-line error of each job in order); `{dir}` is the test's data folder.
CASES = {
    "type and range": (
        ["train.max_steps=abc,0,2.5"],
        [
            "train.max_steps=abc: must be an integer >= 1",
            "train.max_steps=0: must be an integer >= 1",
            "train.max_steps=2.5: must be an integer >= 1",
        ],
    ),
    "learning rate": (
        ["train.lr=fast,-0.1,0"],
        [
            "train.lr=fast: must be a number > 0 and <= 1",
            "train.lr=-0.1: must be a number > 0 and <= 1",
            "train.lr=0: must be a number > 0 and <= 1",
        ],
    ),
    "infinity and overflow": (
        ["train.lr=inf,1e99"],
        ["train.lr=inf: must be a number > 0 and <= 1", "train.lr=1e+99: must be a number > 0 and <= 1"],
    ),
    "overflowing integer": (
        ["train.max_steps=99999999999999999999"],
        ["train.max_steps=99999999999999999999: too large; must be an integer from 1 to 2147483647"],
    ),
    "infinite mean tokens": (["data.mean_tokens=inf"], ["data.mean_tokens=inf: must be a number > 0 and <= 1000000"]),
    "capture values": (
        ["capture.num_steps=abc,0"],
        ["capture.num_steps=abc: must be an integer >= 1", "capture.num_steps=0: must be an integer >= 1"],
    ),
    "capture window": (
        ["profile=torch", "capture.start_step=-5,100"],
        [
            "capture.start_step=-5: not an accepted value; accepted: an integer >= 0, auto",
            "capture.start_step=100, capture.num_steps=3: the profiler's window ends after the last step (19, "
            "train.max_steps=20); accepted: start_step + num_steps <= 20, start_step=auto, or profile=none",
        ],
    ),
    "model shape": (
        ["model.num_attention_heads=3,0", "model.num_layers=0"],
        [
            "model.num_layers=0: must be an integer >= 1",
            "model.num_layers=0: must be an integer >= 1",
        ],
    ),
    "attention heads": (
        ["model.num_attention_heads=3,0,256"],
        [
            "model.num_attention_heads=3: does not divide model.hidden_size=256; accepted: a divisor of 256",
            "model.num_attention_heads=0: must be an integer >= 1",
            "model.hidden_size=256: 1 per head (model.num_attention_heads=256), an odd number rotary embeddings "
            "cannot split; accepted: an even width per head",
        ],
    ),
    # The byte tokenizer a model built from config trains with has 259 ids (256 bytes, BOS, EOS, PAD).
    "vocabulary": (
        ["model.vocab_size=10,258"],
        ["model.vocab_size=10: must be an integer >= 259", "model.vocab_size=258: must be an integer >= 259"],
    ),
    "lora keys with peft=none": (
        ["peft=none", "+peft.r=8,16"],
        [
            "peft.r=8: a LoRA setting, and peft=none trains every weight without LoRA; accepted: peft=lora with it, "
            "or peft=none without it",
            "peft.r=16: a LoRA setting, and peft=none trains every weight without LoRA; accepted: peft=lora with it, "
            "or peft=none without it",
        ],
    ),
    "lora": (["peft.r=0,four"], ["peft.r=0: must be an integer >= 1", "peft.r=four: must be an integer >= 1"]),
    "dropout": (
        ["peft.dropout=1.5,-0.1"],
        ["peft.dropout=1.5: must be a number >= 0 and < 1", "peft.dropout=-0.1: must be a number >= 0 and < 1"],
    ),
    "loader": (
        ["dataloader.num_workers=-1,many"],
        ["dataloader.num_workers=-1: must be an integer >= 0", "dataloader.num_workers=many: must be an integer >= 0"],
    ),
    "sequence": (
        ["train.seq_length=4,100000"],
        [
            "train.seq_length=4: must be an integer >= 8",
            "train.seq_length=100000: longer than model=tiny_llama supports; accepted: 8 to 2048",
        ],
    ),
    "device": (
        ["device=tpu,cuda"],
        # device=cuda: a node with a GPU could run it (the node refuses it, as the last test here shows).
        ["device=tpu: not an accepted value; accepted: auto, cpu, cuda, cuda:N", None],
    ),
    "timeout": (
        ["worker.timeout_min=soon,-5"],
        [
            "worker.timeout_min=soon: must be a number of minutes > 0, null (no limit) or auto (60 on a GPU, no limit on CPU)",
            "worker.timeout_min=-5: must be a number of minutes > 0, null (no limit) or auto (60 on a GPU, no limit on CPU)",
        ],
    ),
    "model folder": (
        ["model=llama2_7b", "model.path={dir}/missing,{dir}/no_config,{dir}/list_config,{dir}/null_layers"],
        [
            "model.path={dir}/missing: no such folder; expected a Hugging Face model folder",
            "model.path={dir}/no_config: config.json is missing or lacks model_type, num_hidden_layers, "
            "max_position_embeddings (FileNotFoundError: [Errno 2] No such file or directory: '{dir}/no_config/config.json'); "
            "expected a folder written by save_pretrained",
            "model.path={dir}/list_config: config.json is missing or lacks model_type, num_hidden_layers, "
            "max_position_embeddings (ValueError: a JSON list, not an object); expected a folder written by save_pretrained",
            "model.path={dir}/null_layers: config.json is missing or lacks model_type, num_hidden_layers, "
            "max_position_embeddings (TypeError: int() argument must be a string, a bytes-like object or a real number, "
            "not 'NoneType'); expected a folder written by save_pretrained",
        ],
    ),
    "dolly files": (
        [
            "data=dolly_file",
            "data.path={dir}/missing.jsonl,{dir}/not_json.jsonl,{dir}/empty.jsonl,"
            "{dir}/huge_line.jsonl,{dir}/no_response.jsonl,{dir}/array.jsonl,{dir}/number_field.jsonl,"
            "{dir}/null_field.jsonl",
        ],
        [
            "data.path={dir}/missing.jsonl: no such file; expected a dolly-format JSONL file",
            "data.path={dir}/not_json.jsonl: line 2 is not JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)); expected one dolly record (a JSON object with instruction and response) per line",
            "data.path={dir}/empty.jsonl: no records (the file is empty); expected one dolly record (a JSON object with "
            "instruction and response) per line",
            "data.path={dir}/huge_line.jsonl: line 1 is 52,428,837 bytes, over 1,048,576; expected one dolly record "
            "(a JSON object with instruction and response) per line",
            "data.path={dir}/no_response.jsonl: line 1 lacks instruction or response; expected one dolly record "
            "(a JSON object with instruction and response) per line",
            "data.path={dir}/array.jsonl: line 1 lacks instruction or response; expected one dolly record "
            "(a JSON object with instruction and response) per line",
            "data.path={dir}/number_field.jsonl: line 2: instruction is 123, not a string; expected one dolly record "
            "(a JSON object with instruction and response) per line",
            "data.path={dir}/null_field.jsonl: line 1: response is null, not a string; expected one dolly record "
            "(a JSON object with instruction and response) per line",
        ],
    ),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    data_files(folder)
    model_folder(folder)
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_value_refuses_its_combination_before_the_sweep_starts(inputs, case):
    # The sweep's own check, in this process; tests/launch/test_precheck.py runs the CLI that prints
    # these lines, exits 1 and records nothing.
    overrides = [o.replace("{dir}", str(inputs)) for o in CASES[case][0]]
    expected = [e.replace("{dir}", str(inputs)) if e else None for e in CASES[case][1]]
    refused = [(num, error) for num, error in enumerate(expected) if error]
    total, lines = refused_combinations("experiment=smoke", *overrides)
    assert total == len(expected)
    assert len(lines) == len(refused), lines
    for line, (num, error) in zip(lines, refused):
        assert line.startswith(f"#{num} ") and line.endswith(f": {error}"), line


def test_a_value_only_the_node_can_judge_fails_its_run_and_the_sweep_goes_on(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32", "train.max_steps=2", "device=cuda,cpu"], tmp_path)
    error = "device=cuda: no NVIDIA GPU is visible to this job; accepted here: auto, cpu"
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "ghsweep: 1 of 2 runs failed"
    assert error in proc.stdout  # the summary table's reason column
    on_disk = results(only_sweep_dir(tmp_path))
    assert [on_disk[i]["status"] for i in sorted(on_disk)] == ["FAILED", "FINISHED"]
    assert on_disk[0]["error"] == error
    runs = all_runs(sqlite_uri(tmp_path))
    assert_nothing_running(runs)
    [parent] = by_role(runs, "sweep")
    assert parent.status == "FAILED"
    children = sorted(by_role(runs, "run"), key=lambda r: int(r.tags["ghsweep.job_num"]))
    assert [c.status for c in children] == ["FAILED", "FINISHED"]
    assert children[0].tags["ghsweep.error"] == error


def test_data_that_makes_no_step_fails_its_run_in_one_line_instead_of_waiting(tmp_path):
    # Only the worker knows how many blocks the data packs into: the run fails, it does not hang.
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "train.max_steps=2",
            "train.seq_length=64",
            "train.micro_batch_size=2",
            "data.num_examples=1",
        ],
        tmp_path,
    )
    error = (
        "ValueError: train.micro_batch_size=2: the data packs into 1 block(s) of train.seq_length tokens (1 per "
        "rank), fewer than one micro-batch, so no step can run; accepted: at most 1, or more data "
        "(data.num_examples, data.path) or a shorter train.seq_length"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    on_disk = results(only_sweep_dir(tmp_path))
    assert [(r["status"], r["error"]) for r in on_disk.values()] == [("FAILED", error)]
    assert_nothing_running(all_runs(sqlite_uri(tmp_path)))


@pytest.mark.parametrize(
    "override, first_line",
    [
        ("precision=fp64", "ghsweep: precision=fp64: precision has no option fp64; accepted: bf16, fp16, fp32, fp8"),
        ("train.max_stepz=3", "ghsweep: train.max_stepz=3: no such key; did you mean train.max_steps?"),
    ],
)
def test_an_option_or_key_the_groups_do_not_have_is_refused_before_hydra_composes(override, first_line):
    # ghsweep.__main__'s check of the command line; tests/config/test_keys.py runs the CLI that prints it.
    with pytest.raises(SystemExit) as refused:
        check_overrides(["-m", "experiment=smoke", override])
    assert str(refused.value.code).startswith(first_line)


def test_a_launcher_profile_that_does_not_exist_is_one_line_before_any_run(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "hydra/launcher=nowhere"], tmp_path)
    assert proc.returncode == 1
    assert "hydra/launcher=nowhere: hydra/launcher has no option nowhere; accepted: " in proc.stderr, proc.stderr[
        -2000:
    ]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.rglob("result.json"))


@pytest.mark.parametrize(
    "override, line",
    [
        ("dry_run=no", "dry_run=no: not an accepted value; accepted: True, False"),
        ("force=no", "force=no: not an accepted value; accepted: True, False"),
        (
            "report.baseline=-1",
            "report.baseline=-1: not an accepted value; accepted: an integer >= 0, a string, null",
        ),
        ("tracking.experiment=", "tracking.experiment=: not an MLflow experiment name; accepted: a non-empty name"),
        (
            "hydra.job.name=../../../X",
            "hydra.job.name=../../../X: names the job's log file in its run directory; accepted: letters, digits, "
            "'_', '-' and '.', no path",
        ),
        (
            "+container.env.X=${oc.env:GHSWEEP_TEST_UNSET}",
            'container.env.X: KeyError raised while resolving interpolation: "Environment variable '
            "'GHSWEEP_TEST_UNSET' not found\"; set what it names, or give it a default (${oc.env:NAME,default})",
        ),
        (
            "tracking.uri=${oc.env:GHSWEEP_TEST_UNSET}",
            'tracking.uri: KeyError raised while resolving interpolation: "Environment variable '
            "'GHSWEEP_TEST_UNSET' not found\"; set what it names, or give it a default (${oc.env:NAME,default})",
        ),
    ],
)
@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "single run"])
def test_what_a_sweep_reads_before_its_runs_is_refused_in_one_line(override, line, sweep):
    # The check Hydra's first callback makes (launch.callbacks.check_launch), on the config Hydra hands it.
    with hydra_on_conf(), pytest.raises(SystemExit) as refused:
        check_launch(launch_config("experiment=smoke", "precision=fp32", override, sweep=sweep))
    assert refused.value.code == f"ghsweep: {line}"


@pytest.mark.parametrize("mode", [["-m"], []], ids=["sweep", "single run"])
def test_a_launch_refusal_reaches_the_terminal_before_any_record_or_log(tmp_path, mode):
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    proc = run_cli([*mode, "experiment=smoke", "precision=fp32", "hydra.job.name=../../../X"], cwd)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: hydra.job.name=../../../X: names the job's log file in its run directory; accepted: letters, "
        "digits, '_', '-' and '.', no path"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (cwd / "mlflow.db").exists() and not list(cwd.rglob("result.json"))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []  # no log written outside (../../../X.log)
