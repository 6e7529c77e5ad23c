"""hydra/sweeper=tune through the real CLI on CPU: the tiny model, a real MLflow store, a real Optuna journal.

The studies minimise or maximise `final_loss`, which is deterministic on CPU for a given learning
rate (same seed, same batches): lr 3e-3 trains most in 6 steps, 1e-6 barely at all. fp8 fails
validation on CPU, so every fp8 trial is a failed run.
"""

from __future__ import annotations

import re
import signal
import stat
from pathlib import Path

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from ghsweep.core.errors import SpaceError, TuneConfigError
from ghsweep.core.names import ROLE_SWEEP, STUDY_TAG
from ghsweep.launch.slurm.submitted_jobs import load_jobs
from ghsweep.tracking.mlflow_store import MlflowStore
from ghsweep.tune.settings import TuneSettings
from ghsweep.tune.space import SearchSpace
from tests.support.cli import assert_one_line_errors, run_cli, start_cli
from tests.support.compose import compose_config

# A secret every trial gets: no record of the study may hold it (its journal, reports, console, MLflow).
SECRET = "TuNeSeCrEt-4k"
SPACE = [
    "hydra/sweeper=tune",
    "experiment=smoke",
    "train.max_steps=6",
    "train.seq_length=64",
    f"+db.accessToken={SECRET}",
    "train.lr=1e-6,1e-4,3e-3",
]
STUDY = [
    "-m",
    *SPACE,
    "precision=fp32,fp8",
    "tune.objective=final_loss",
    "tune.direction=minimize",
    "tune.startup_trials=2",
]


@pytest.fixture(scope="module")
def cwd(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tune")


def load_studies(cwd: Path) -> dict[str, optuna.Study]:
    storage = JournalStorage(JournalFileBackend(str(cwd / "tune.journal")))
    return {name: optuna.load_study(study_name=name, storage=storage) for name in optuna.get_all_study_names(storage)}


def study_of(cwd: Path, out: str) -> optuna.Study:
    name = next(line.split()[3] for line in out.splitlines() if line.startswith("ghsweep tune: study "))
    return load_studies(cwd)[name]


def counted_trials(study: optuna.Study) -> list:
    """The trials that count towards tune.trials (not a repeat told FAIL, nor an interrupted one)."""
    return [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def sweep_dir(out: str) -> Path:
    line = next(line for line in out.splitlines() if "runs finished" in line and "(sweep directory " in line)
    return Path(line.split("(sweep directory ")[1].rstrip(")"))


@pytest.fixture(scope="module")
def first(cwd):
    proc = run_cli([*STUDY, "tune.trials=6"], cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_study_finds_the_best_and_learns_from_failed_runs(cwd, first):
    study = study_of(cwd, first.stdout)
    counted = counted_trials(study)
    # Six trials over the six combinations: each one measured once, none repeated.
    assert len(counted) == 6 and len({tuple(sorted(t.params.items())) for t in counted}) == 6
    assert study.best_trial.params == {"train.lr": "0.003", "precision": "fp32"}
    failed = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert failed, "the space's fp8 half should have been tried"
    for t in failed:
        assert t.params["precision"] == "fp8" and t.constraints["run_failed"] == 1.0
        assert "precision=fp8: needs an NVIDIA GPU" in t.user_attrs["error"]
    assert "Best: trial" in first.stdout and "train.lr=0.003 precision=fp32" in first.stdout
    reproduce = (
        "python -m ghsweep experiment=smoke train.max_steps=6 train.seq_length=64 '+db.accessToken=***' "
        "train.lr=0.003 precision=fp32"
    )
    assert f"reproduce: {reproduce}" in first.stdout
    assert "Knob importance for final_loss (Optuna): " in first.stdout
    report = cwd / sweep_dir(first.stdout) / "tune"
    assert (report / "best.txt").read_text() == reproduce + "\n"
    assert (report / "history_final_loss.png").stat().st_size > 0
    # Failed trials are part of the search: the command still succeeds, and its answer is its last line.
    assert f"{len(failed)} failed" in first.stdout
    assert first.stdout.rstrip().splitlines()[-1] == f"  {reproduce}"


def test_a_failed_combination_asked_again_is_not_run_again(tmp_path):
    proc = run_cli(["-m", *SPACE, "precision=fp8", "tune.trials=4", "hydra.sweep.dir=sweep"], tmp_path)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "ghsweep tune: no trial finished within the constraints" in proc.stderr
    study = study_of(tmp_path, proc.stdout)
    counted = counted_trials(study)
    assert [t.state for t in counted] == [TrialState.PRUNED] * 4
    # Four trials over three learning rates: the fourth asks for a combination that failed already.
    repeats = [t for t in counted if t.user_attrs["error"].startswith("as in trial ")]
    assert repeats and all("precision=fp8: needs an NVIDIA GPU" in t.user_attrs["error"] for t in repeats)
    assert len(list((tmp_path / "sweep").glob("*/result.json"))) == 4 - len(repeats)


def test_the_study_records_no_secret_and_its_journal_is_the_owners(cwd, first):
    assert SECRET not in first.stdout + first.stderr
    assert "'+db.accessToken=***'" in first.stdout  # the trial lines, the reproduce line and the answer
    journal = cwd / "tune.journal"
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    sweep = cwd / sweep_dir(first.stdout)
    records = [journal, cwd / "mlflow.db", *(sweep / "tune").iterdir()]
    assert [p.name for p in records if SECRET.encode() in p.read_bytes()] == []
    # The run directories' config.yaml is the worker's: the one file of a trial with the real value.
    assert all(SECRET in (run / "config.yaml").read_text() for run in sweep.glob("[0-9]*"))


def test_trials_are_mlflow_children_of_the_tuning_parent(cwd, first):
    store = MlflowStore(f"sqlite:///{cwd / 'mlflow.db'}", "ghsweep")
    study = study_of(cwd, first.stdout)
    (parent,) = store.search(role=ROLE_SWEEP, tags={STUDY_TAG: study.study_name})
    assert parent.status == "FINISHED"
    assert parent.tags["ghsweep.tune.best_command"].endswith("train.lr=0.003 precision=fp32")
    assert {"tune/tune.md", "tune/best.txt", "tune/history_final_loss.png"} <= store.artifact_paths(
        parent.run_id, "tune"
    )
    for trial in counted_trials(study):
        run = store.get_run(trial.user_attrs["run_id"])
        assert run.tags[STUDY_TAG] == study.study_name
        assert run.params["train.lr"] == str(float(trial.params["train.lr"]))
        assert run.status == ("FINISHED" if trial.state == TrialState.COMPLETE else "FAILED")
    own = [
        t
        for t in counted_trials(study)
        if store.get_run(t.user_attrs["run_id"]).tags.get("mlflow.parentRunId") == parent.run_id
    ]
    assert own, "the trials that trained are children of the tuning run"


def test_rerun_continues_the_study_and_reuses_finished_runs(cwd, first):
    proc = run_cli([*STUDY, "tune.trials=8"], cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "6 of 8 trials done before this sweep" in proc.stdout
    study = study_of(cwd, proc.stdout)
    assert len(counted_trials(study)) == 8
    # Both new trials picked combinations the study had already run: reused, not trained again.
    assert proc.stdout.count("skipped, already FINISHED in MLflow") + proc.stdout.count("FAILED: precision=fp8") == 2


def test_a_stopped_study_resumes_with_the_interrupted_trial(cwd, first):
    args = [*STUDY, "train.max_steps=5", "tune.trials=3"]  # new runs: 5 steps were never trained
    proc = start_cli(args, cwd, merge_stderr=True)
    for line in proc.stdout:
        if "training in a worker process" in line:  # the first trial is training: stop the sweep there
            proc.send_signal(signal.SIGINT)
            break
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    (stopped,) = [s for s in load_studies(cwd).values() if any(t.state == TrialState.RUNNING for t in s.trials)]
    interrupted = stopped.trials[-1]

    again = run_cli(args, cwd)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    study = study_of(cwd, again.stdout)
    assert study.study_name == stopped.study_name
    assert study.trials[interrupted.number].state == TrialState.FAIL
    retry = study.trials[interrupted.number + 1]
    assert retry.params == interrupted.params and retry.user_attrs["retry_of"] == interrupted.number
    assert len(counted_trials(study)) == 3


def test_a_constraint_rules_out_the_unconstrained_best(cwd, first):
    # Maximising the loss would pick lr 1e-6 (5.87); the bound leaves lr 1e-4 (5.82). The runs are reused.
    proc = run_cli(
        [
            "-m",
            *SPACE,
            "precision=fp32",
            "tune.objective=final_loss",
            "tune.direction=maximize",
            "+tune.max.final_loss=5.845",
            "tune.trials=6",
            "tune.startup_trials=6",
        ],
        cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = study_of(cwd, proc.stdout)
    tried = {t.params["train.lr"] for t in counted_trials(study)}
    assert tried == {"1e-06", "0.0001", "0.003"}, "the seeded random start covers the three rates"
    assert study.best_trial.params["train.lr"] == "0.0001"
    for t in counted_trials(study):
        assert (t.constraints["final_loss<=5.845"] > 0) == (t.params["train.lr"] == "1e-06")
    assert "violates final_loss<=5.845" in proc.stdout


def test_two_objectives_give_the_pareto_front(cwd, first):
    proc = run_cli(
        [
            "-m",
            *SPACE,
            "precision=fp32",
            "tune.objective=[final_loss,steps]",
            "tune.direction=[minimize,maximize]",
            "tune.trials=4",
            "tune.startup_trials=4",
        ],
        cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = study_of(cwd, proc.stdout)
    front = {t.params["train.lr"] for t in study.best_trials}
    assert front == {"0.003"}  # same steps for all: the lowest loss dominates
    assert "Pareto front: trial" in proc.stdout
    assert (cwd / sweep_dir(proc.stdout) / "tune" / "pareto_front.png").stat().st_size > 0


@pytest.mark.parametrize(
    "bad, message",
    [
        (["tune.direction=up"], "tune.direction=up: accepted: maximize, minimize"),
        (["tune.objective=[a,b]"], "tune.direction=maximize: one direction per objective (2)"),
        (["+tune.min.mfu=high"], "tune.min.mfu=high: must be a finite number"),
        (["tune.trials=0"], "tune.trials=0: must be a whole number >= 1"),
        (["+tune.max.final_loss=nan"], "tune.max.final_loss=nan: must be a finite number"),
        (["tune.prune=yes"], "tune.prune=yes: accepted: true, false"),
        (["tune.prune_below_tokens_per_s=5"], "tune.prune_below_tokens_per_s=5: set by the study for each trial"),
        (
            ["tune.prune=true", "tune.objective=final_loss", "tune.direction=minimize"],
            "tune.objective=final_loss (direction minimize) cannot be pruned: accepted with tune.objective=tokens_per_s",
        ),
    ],
)
def test_bad_tune_settings_are_one_line_errors(bad, message):
    # The sweeper's own reading of tune.*, in this process; the CLI runs below take a refusal to the
    # terminal and to the sweep's MLflow run.
    with pytest.raises(TuneConfigError) as refused:
        TuneSettings.from_config(compose_config("hydra/sweeper=tune", "experiment=smoke", *bad).tune)
    assert message in str(refused.value)


def test_a_secret_cannot_be_a_searched_knob():
    # A trial's values are its record (the study's storage, its reports): the search space refuses a secret.
    with pytest.raises(SpaceError) as refused:
        SearchSpace.parse(OverridesParser.create(), ["+db.clientSecrets=a,b", "train.lr=0.1,0.2"])
    assert "a secret cannot be searched; give +db.clientSecrets one value" in str(refused.value)


@pytest.mark.parametrize(
    "bad, message",
    [
        (["tune.trials=0"], "tune.trials=0: must be a whole number >= 1"),
        # A SLURM profile, as wait=false asks; its jobs are never submitted.
        (
            ["wait=false", "hydra/launcher=local_slurm", "tracking=sqlite"],
            "wait=false: a tuning study needs each batch's",
        ),
    ],
    ids=["tune setting", "launch setting"],
)
def test_a_bad_tune_setting_reaches_the_terminal_and_the_sweeps_record(tmp_path, bad, message):
    proc = run_cli(["-m", *SPACE, *bad], tmp_path)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    # Refused before the sweep's MLflow run was made: nothing recorded, nothing left RUNNING.
    db = tmp_path / "mlflow.db"
    assert not db.exists() or not MlflowStore(f"sqlite:///{db}", "ghsweep").search()


def test_a_journal_cut_short_is_refused_before_anything_is_recorded(tmp_path):
    (tmp_path / "tune.journal").write_text('{"op_code": 0, "worker_id": "w", "study_name": "s", "direct')
    proc = run_cli(["-m", *SPACE], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ghsweep: tune.storage=tune.journal: {tmp_path / 'tune.journal'} line 1 is cut short (no end of line); "
        "restore it, or start a new study in another file (tune.storage=NEW.journal); nothing was recorded"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "multirun").exists()


def test_nothing_to_search_is_an_error(tmp_path):
    proc = run_cli(["-m", "hydra/sweeper=tune", "experiment=smoke", "precision=bf16"], tmp_path)
    assert proc.returncode != 0 and "hydra/sweeper=tune: nothing to search" in proc.stderr, proc.stderr[-2000:]


def test_parallel_trials_run_as_one_batch_of_submitit_jobs(tmp_path):
    proc = run_cli(
        [
            "-m",
            "hydra/sweeper=tune",
            "hydra/launcher=submitit_local",
            "hydra.launcher.cpus_per_task=1",
            "experiment=smoke",
            "train.max_steps=2",
            "train.seq_length=64",
            "precision=fp32,bf16",
            "tune.objective=final_loss",
            "tune.direction=minimize",
            "tune.trials=2",
            "tune.parallel=2",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(load_jobs(tmp_path / "sweep")) == 2 and "ghsweep: submitted 2 jobs (local)" in proc.stdout
    study = study_of(tmp_path, proc.stdout)
    assert [t.state for t in counted_trials(study)] == [TrialState.COMPLETE] * 2


def test_a_small_space_is_enumerated_before_a_repeat_and_the_comparison_lists_each_run_once(tmp_path):
    # The command, with more trials than the space has combinations.
    proc = run_cli(
        [
            "-m",
            "hydra/sweeper=tune",
            "experiment=smoke",
            "precision=fp32,bf16",
            "offload=off,on",
            "train.max_steps=4",
            "tune.trials=5",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = study_of(tmp_path, proc.stdout)
    counted = [t for t in study.trials if t.state == TrialState.COMPLETE]
    combos = [tuple(sorted(t.params.items())) for t in counted]
    assert len(counted) == 5 and len(set(combos[:4])) == 4  # the fifth has nothing new left to ask
    assert combos[4] in combos[:4]
    # Four runs trained; the fifth trial reused its combination's run, which the comparison lists once.
    assert proc.stdout.count("skipped, already FINISHED in MLflow") == 1
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "ghsweep")
    (parent,) = store.search(role=ROLE_SWEEP)
    listed = parent.tags["ghsweep.run_ids"].split(",")
    assert len(listed) == len(set(listed)) == 4
    comparison = (tmp_path / "sweep" / "comparison" / "comparison.md").read_text()
    assert len(re.findall(r"^\| ?[0-4] ", comparison, flags=re.M)) == 4


def test_a_trial_slower_than_the_best_beyond_the_noise_is_pruned(tmp_path):
    """tune.prune on CPU. The two trials differ in work per token, not in a CPU feature (bf16 is slower
    than fp32 on some CPUs and as fast on others): 16 layers train the tiny model several times
    slower than 1 on any CPU. Measured after the 1-layer trial, the 16-layer one is stopped at its
    first interval and told to Optuna as PRUNED with its tokens/s; the first measures to its step
    budget. The pruned run is FINISHED in MLflow with what it measured."""
    proc = run_cli(
        [
            "-m",
            "hydra/sweeper=tune",
            "experiment=smoke",
            "model.num_layers=1,16",
            "train.max_steps=6",
            "train.log_every=3",
            "train.seq_length=64",
            "train.measure=true",
            "train.measure_ci_pct=0.001",  # narrower than a CPU can measure: the budget ends a run not pruned
            "train.measure_max_steps=24",
            "tune.trials=2",
            "tune.prune=true",
            "tune.seed=2",  # Optuna 5's first random draw under seed 2 is the first choice
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = study_of(tmp_path, proc.stdout)
    first, second = counted_trials(study)
    assert (first.params["model.num_layers"], second.params["model.num_layers"]) == ("1", "16"), (
        "the seed's order changed"
    )
    assert first.state == TrialState.COMPLETE and "pruned" not in first.user_attrs
    assert second.state == TrialState.PRUNED and "below the best's" in second.user_attrs["pruned"], proc.stdout[-2000:]
    (steps, tokens_per_s), *_ = second.intermediate_values.items()
    bar = first.user_attrs["tokens_per_s_ci"][0]
    assert 6 <= steps < 24 and tokens_per_s < bar
    assert "error" not in second.user_attrs  # pruned, not failed: not answered from record as a failure
    assert "1 trials finished, 1 pruned (slower than the best beyond the noise), 0 failed" in proc.stdout
    assert re.search(r"^\d+ +16 +[\d.]+ +pruned +stopped after \d+ steps", proc.stdout, flags=re.M), proc.stdout[-2000:]
    runs = {
        r.params["model.num_layers"]: r
        for r in MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", "ghsweep").search(role="run")
    }
    assert runs["16"].status == "FINISHED" and runs["16"].tags["ghsweep.measure_stop"] == "pruned"
    assert runs["1"].tags["ghsweep.measure_stop"] == "step_budget"
