"""What a new user's first commands get: refusals that need no node before anything is recorded (for
every combination at once), a dry run that refuses what the run would and exits non-zero, a cluster
dry run without SLURM, one line where SLURM is missing, and a single run that says where its
results went."""

from __future__ import annotations

import copy
import re
import shutil
import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from ghsweep.core.names import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from ghsweep.launch.precheck import ComposedOnce, sweep_refusals
from tests.optional_env import unavailable
from tests.support.cli import assert_one_line_errors, run_cli
from tests.support.compose import hydra_on_conf
from tests.support.mlflow_records import MlflowRecords, sqlite_uri
from tests.support.ports import free_port
from tests.support.sweep_dirs import assert_nothing_ran

FP8_ON_CPU = (
    "precision=fp8: needs an NVIDIA GPU of compute capability >= 8.9 and this run has none (device=cpu); "
    "accepted here: fp32, fp16, bf16"
)


def test_a_sweep_with_values_no_node_can_run_is_refused_whole_before_anything_is_recorded(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "precision=fp32,fp8", "train.max_steps=-1,2"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "ghsweep: #0 experiment=smoke,precision=fp32,train.max_steps=-1: train.max_steps=-1: must be an integer >= 1",
        "ghsweep: #2 experiment=smoke,precision=fp8,train.max_steps=-1: train.max_steps=-1: must be an integer >= 1",
        f"ghsweep: #3 experiment=smoke,precision=fp8,train.max_steps=2: {FP8_ON_CPU}",
        "ghsweep: 3 of 4 combinations cannot run on any node; nothing was submitted or recorded",
    ]
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.rglob("result.json"))


def test_the_dry_run_refuses_what_the_run_would_and_exits_non_zero(tmp_path):
    proc = run_cli(
        ["-m", "experiment=smoke", "train.lr=-1,0.1", "precision=fp8,fp32", "dry_run=true"],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    workers = re.findall(r"(?m)^  worker:  (.*)$", proc.stdout)
    assert workers[:3] == [
        "(not runnable) train.lr=-1: must be a number > 0 and <= 1",
        "(not runnable) train.lr=-1: must be a number > 0 and <= 1",
        f"(not runnable) {FP8_ON_CPU}",
    ]
    assert "-m ghsweep.train.worker" in workers[3]
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: dry run: 3 combination(s) not runnable, marked above; the sweep would refuse to start"
    )
    assert_nothing_ran(tmp_path)


def test_one_run_refused_is_one_line_and_nothing_recorded(tmp_path):
    proc = run_cli(["experiment=smoke", "train.max_steps=abc"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: train.max_steps=abc: must be an integer >= 1; nothing was recorded"
    )
    assert_one_line_errors(proc.stdout, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists()
    dry = run_cli(["experiment=smoke", "precision=fp8", "dry_run=true"], tmp_path)
    assert dry.returncode == 1 and dry.stderr.strip().splitlines()[-1] == f"ghsweep: not runnable: {FP8_ON_CPU}"


# What took a value error 3.4 s longer than a key error: these imports, before the check (issue 54).
HEAVY = ("torch", "mlflow", "matplotlib", "submitit", "transformers")


@pytest.mark.parametrize(
    "mode, refusal",
    [
        ([], "ghsweep: train.lr=abc: must be a number > 0 and <= 1; nothing was recorded"),
        (["-m"], "ghsweep: 1 of 2 combinations cannot run on any node; nothing was submitted or recorded"),
    ],
    ids=["single run", "sweep"],
)
def test_a_value_is_refused_before_any_heavy_import(tmp_path, mode, refusal):
    proc = run_cli(
        [*mode, "experiment=smoke", "train.lr=abc" if not mode else "train.lr=abc,1e-4"],
        tmp_path,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1 and said[-1] == refusal, proc.stderr[-3000:]
    assert sorted(imported & set(HEAVY)) == []


@pytest.fixture
def no_slurm(tmp_path) -> dict[str, str]:
    """A PATH with this Python and without SLURM's commands (as on a laptop)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    assert shutil.which("srun", path=str(bin_dir)) is None
    return {"PATH": str(bin_dir)}


def test_a_cluster_sweep_is_previewed_without_slurm(tmp_path, no_slurm):
    proc = run_cli(
        ["-m", "hydra/launcher=gh200", "precision=bf16,fp8", "offload=on,off", "dry_run=true"], tmp_path, env=no_slurm
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_one_line_errors(proc.stdout, proc.stderr)
    launches = re.findall(r"(?m)^  launch:  (.*)$", proc.stdout)
    assert len(launches) == 4 and all(line.startswith("sbatch --array=0-3%4 ") for line in launches)
    assert "--partition=gh" in launches[0]
    # The batch script itself, once for the job array, line for line as sbatch gets it.
    script = proc.stdout.split("batch script of the job array of 4 combination(s):\n", 1)[1].splitlines()
    assert script[0] == "    #!/bin/bash" and "    #SBATCH --partition=gh" in script
    assert any(line.startswith("    srun ") for line in script)
    assert proc.stdout.strip().splitlines()[-1] == "ghsweep: dry run, 4 combinations; nothing was submitted"
    assert_nothing_ran(tmp_path)


def test_a_cluster_sweep_without_slurm_is_one_line_before_anything_is_recorded(tmp_path, no_slurm):
    proc = run_cli(["-m", "hydra/launcher=gh200", "precision=bf16,fp8"], tmp_path, env=no_slurm)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert line == (
        "ghsweep: hydra/launcher=gh200 submits to SLURM, and its commands are not on PATH here (sbatch, srun, "
        "scontrol); submit from a machine of the cluster. `python -m ghsweep -m hydra/launcher=gh200 ... "
        "dry_run=true` previews the sweep anywhere"
    )
    assert not (tmp_path / "mlflow.db").exists()


def test_a_cluster_sweep_whose_controller_is_down_is_one_line_before_anything_is_recorded(tmp_path):
    if shutil.which("scontrol") is None:
        unavailable("needs SLURM's client commands (apt-get install slurm-client)")
    # A cluster whose controller nothing serves: a port nothing listens on.
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"ClusterName=down\nSlurmctldHost=localhost\nSlurmctldPort={free_port()}\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    proc = run_cli(["-m", "hydra/launcher=local_slurm", "experiment=smoke"], tmp_path, env={"SLURM_CONF": str(conf)})
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert re.fullmatch(
        r"ghsweep: hydra/launcher=local_slurm: the SLURM controller does not answer \(`scontrol ping`: "
        r"Slurmctld\(primary\) at \S+ is DOWN\)\. `python -m ghsweep -m hydra/launcher=local_slurm \.\.\. "
        r"dry_run=true` previews the sweep anywhere",
        line,
    ), line
    assert not (tmp_path / "mlflow.db").exists()


def test_a_single_run_ends_with_its_summary_line_and_opens_as_model_training(tmp_path):
    proc = run_cli(["experiment=smoke", "precision=fp32", "train.max_steps=2", "train.seq_length=64"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        r"ghsweep: run FINISHED: [\d,]+ tokens/s, [\d.]+ ms a step, final loss [\d.]+; report (\S+); "
        r"MLflow run ([0-9a-f]{32}) in experiment ghsweep at (\S+)",
        last,
    )
    assert found, last
    report, run_id, uri = found.groups()
    assert Path(report).is_file() and uri == sqlite_uri(tmp_path)
    records = MlflowRecords(uri)
    assert records.client.get_run(run_id).info.status == "FINISHED"
    assert records.client.get_experiment(records.experiment_id).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND


def test_the_sweeper_and_launcher_get_each_combination_as_the_check_composed_it(tmp_path, monkeypatch):
    with hydra_on_conf():
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        line = ["experiment=smoke", "precision=fp32,bf16", f"hydra.sweep.dir={tmp_path}"]
        master = hydra.compose_config("config", line, run_mode=RunMode.MULTIRUN, with_log_configuration=False)
        assert sweep_refusals(master) == (2, [])
        loader = hydra.config_loader  # what Hydra hands the sweeper and the launcher it makes next
        assert isinstance(loader, ComposedOnce)
        # Pickled into a submitit job with its launcher (its __reduce__, which deepcopy takes too), it is
        # Hydra's own: the job composes for itself.
        assert type(copy.deepcopy(loader)) is type(loader.loader)
        composed: list[list[str]] = []
        hydras_own = loader.loader.load_sweep_config
        monkeypatch.setattr(
            loader.loader,
            "load_sweep_config",
            lambda master, overrides: composed.append(overrides) or hydras_own(master, overrides),
        )
        first = loader.load_sweep_config(master, ["experiment=smoke", "precision=fp32"])
        steps = first.train.max_steps
        first.train.max_steps = steps + 1  # as the launcher writes into its config (the job's number)
        again = loader.load_sweep_config(master, ["experiment=smoke", "precision=fp32"])
        assert (again.precision.name, again.train.max_steps) == ("fp32", steps) and composed == []
        other = loader.load_sweep_config(master, ["precision=bf16", "offload=on"])  # not a combination of the check
        assert composed == [["precision=bf16", "offload=on"]] and other.offload.enabled is True


@pytest.mark.parametrize(
    "subdir, refused",
    [
        (
            "${precision.name}",
            [
                "#1 experiment=smoke,offload=off,precision=fp32: hydra.sweep.subdir=${precision.name}: gives it the "
                "run directory of #0 ({sweep}/fp32); each combination needs its own",
                "#3 experiment=smoke,offload=off,precision=bf16: hydra.sweep.subdir=${precision.name}: gives it the "
                "run directory of #2 ({sweep}/bf16); each combination needs its own",
            ],
        ),
        ("${precision}", ["#{n} {name}: hydra.sweep.subdir=${precision}: resolves to a config node"]),
        ("../elsewhere", ["#{n} {name}: hydra.sweep.subdir=../elsewhere: ../elsewhere is not inside"]),
        ("${precision.name}_${offload.enabled}", []),
    ],
    ids=["shared", "node", "outside", "distinct"],
)
def test_a_subdir_that_cannot_give_each_combination_its_own_run_directory_is_refused_before_the_sweep(
    tmp_path, subdir, refused
):
    with hydra_on_conf():
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        line = ["experiment=smoke", "precision=fp32,bf16", "offload=on,off", f"hydra.sweep.dir={tmp_path}"]
        master = hydra.compose_config(
            "config", [*line, f"hydra.sweep.subdir={subdir}"], run_mode=RunMode.MULTIRUN, with_log_configuration=False
        )
        total, lines = sweep_refusals(master)
    names = [f"experiment=smoke,offload={o},precision={p}" for p in ("fp32", "bf16") for o in ("on", "off")]
    if "{n}" in "".join(refused):  # every combination, the same reason
        refused = [refused[0].replace("{n}", str(n)).replace("{name}", name) for n, name in enumerate(names)]
    assert total == 4 and len(lines) == len(refused), lines
    for line, start in zip(lines, refused, strict=True):
        assert line.startswith(start.replace("{sweep}", str(tmp_path))), line
