"""`dry_run=true` through the real CLI: every combination's run directory, worker command and
SLURM parameters are printed, and nothing runs, is submitted or is recorded."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from ghsweep.capture.profiler_plan import resolve
from ghsweep.core.errors import ConfigError
from ghsweep.launch.callbacks import SweepCallback
from ghsweep.launch.dry_run import describe
from ghsweep.launch.run_planner import dry_run_plans, node_plan
from tests.support.cli import run_cli
from tests.support.compose import compose_config, compose_typed, hydra_on_conf, launch_config
from tests.support.stand_ins import NODE_GPU, fake_runtime, tool
from tests.support.sweep_dirs import assert_nothing_ran


def blocks(stdout: str) -> list[list[str]]:
    """The printed combinations: a `#N name` line followed by its indented lines."""
    found: list[list[str]] = []
    for line in stdout.splitlines():
        if re.match(r"^#\d+ ", line):
            found.append([line])
        elif found and line.startswith("  ") and len(found[-1]) < 5:
            found[-1].append(line)
    return found


def test_slurm_sweep_dry_run_prints_every_combination_and_submits_nothing(tmp_path):
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=local_slurm",
            "experiment=smoke",
            "precision=fp32,bf16",
            "offload=off,on",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = blocks(proc.stdout)
    assert len(found) == 4
    run_dirs = set()
    for i, block in enumerate(found):
        head, run_dir, worker, launch = block[:4]
        assert head.startswith(f"#{i} ")
        run_dirs.add(run_dir.split("run dir: ")[1])
        assert worker.endswith(f"-m ghsweep.train.worker {run_dir.split('run dir: ')[1]}")
        for option in (
            "--array=0-3%4",
            "--cpus-per-task=1",
            "--gpus-per-node=1",
            "--mem=2GB",
            "--partition=debug",
            "--time=10",
            "--signal=USR2@120",
        ):
            assert option in launch.split(), option
    assert len(run_dirs) == 4
    assert "dry run, 4 combinations; nothing was submitted" in proc.stdout
    assert_nothing_ran(tmp_path)
    assert not (tmp_path / "multirun").exists()  # no directory that `ghsweep.status` would take for a sweep


def test_gh200_dry_run_shows_the_container_command(tmp_path):
    image = tmp_path / "ghsweep-nemo.sif"
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=gh200",
            "experiment=smoke",
            "precision=fp32",
            f"container.image={image}",
            "hydra.launcher.partition=gh",
            "hydra.launcher.account=proj1",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((_, run_dir, worker, launch),) = [b[:4] for b in blocks(proc.stdout)]
    run_dir = run_dir.split("run dir: ")[1]
    assert worker.split("worker:  ")[1].startswith(f"singularity exec --nv --bind {run_dir} ")
    assert f" {image} python3 -m ghsweep.train.worker {run_dir}" in worker
    for option in (
        "--gpus-per-node=1",
        "--cpus-per-task=72",
        "--mem=400GB",
        "--time=120",
        "--partition=gh",
        "--account=proj1",
    ):
        assert option in launch.split(), option
    # The profile's tracking server, with no tracking flag.
    assert "  mlflow:  http://login-node:5000 (experiment ghsweep)" in proc.stdout.splitlines()
    assert_nothing_ran(tmp_path)


def test_local_dry_run_prints_and_trains_nothing(tmp_path):
    proc = run_cli(["experiment=smoke", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((head, run_dir, worker, launch),) = [b[:4] for b in blocks(proc.stdout)]
    assert "-m ghsweep.train.worker" in worker and "launch:  in this process (hydra/launcher=local)" in launch
    assert f"  mlflow:  sqlite:///{tmp_path.resolve()}/mlflow.db (experiment ghsweep)" in proc.stdout.splitlines()
    assert_nothing_ran(tmp_path)


# hydra-submitit-launcher's own SLURM launcher blocks and records no jobs for `ghsweep.status` either.
@pytest.mark.parametrize("launcher", ["local", "submitit_slurm"])
def test_wait_false_needs_a_slurm_launcher(tmp_path, monkeypatch, launcher):
    # The sweep's first callback, in this process; tests/launch/test_precheck.py runs the CLI through
    # one of its refusals (a cluster sweep without SLURM).
    monkeypatch.chdir(tmp_path)
    config = ["experiment=smoke", "wait=false", f"hydra/launcher={launcher}"]
    with hydra_on_conf(), pytest.raises(SystemExit) as refused:
        SweepCallback().on_multirun_start(launch_config(*config, sweep=True))
    assert refused.value.code == (
        f"wait=false: needs a SLURM launcher profile (e.g. hydra/launcher=gh200); this sweep uses hydra/launcher={launcher}"
    )
    assert_nothing_ran(tmp_path)


# --- The worker command a dry run prints is the one the job builds on the node (profile plans) ---

NODE_MARK = "resolved on the node"


def combinations(stdout: str) -> dict[str, dict[str, str]]:
    """The printed combinations by their overrides: {'run dir': ..., 'worker': ..., 'launch': ...,
    'profile': ..., 'else': the worker line of profile=auto's other choice}."""
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in stdout.splitlines():
        if re.match(r"^#\d+ ", line):
            current = found.setdefault(line.split(" ", 1)[1], {})
        elif re.match(r"^  [a-z ]+: ", line) and current is not None:
            label, text = line.strip().split(": ", 1)
            current.setdefault(label, text.strip())
        elif line.startswith(" " * 11) and "profile" in current:
            current["else"] = line.strip()
    return found


def overrides_of(name: str) -> dict[str, str]:
    """`a=1,b=2` (a combination's name) as {'a': '1', 'b': '2'}, without dry_run."""
    pairs = dict(p.split("=", 1) for p in name.split(","))
    pairs.pop("dry_run")
    return pairs


def node_command(overrides: dict[str, str], run_dir: Path, on_gpu: bool) -> list[str]:
    """What the job builds on a node with (on_gpu) or without a GPU, for the same config, on this
    machine's PATH: the worker command of the plan ghsweep.launch.job.run_one makes there."""
    cfg = compose_config(*(f"{k}={v}" for k, v in overrides.items()))
    plan, _ = node_plan(cfg, run_dir, "run", [], NODE_GPU if on_gpu else None, slurm_tasks=None)
    return plan.worker_command


def test_nsys_worker_command_is_the_one_the_job_runs_with_and_without_container(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    nsys, _ = tool(bin_dir, "nsys"), tool(bin_dir, "ncu")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")  # the node's nsys and ncu, found on PATH
    image = tmp_path / "ghsweep-nemo.sif"
    image.touch()  # on the node, where the job checks it
    # The image brings its own nsys and ncu; the host's are not used inside it.
    fake_runtime(bin_dir), tool(Path(f"{image}.bin"), "nsys"), tool(Path(f"{image}.bin"), "ncu")
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=gh200",
            "experiment=smoke",
            "device=auto",
            "profile=nsys,nsys_ncu,auto",
            f"container.image={image},null",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = combinations(proc.stdout)
    assert len(found) == 6
    for name, block in found.items():
        overrides = {"hydra/launcher": "gh200", **overrides_of(name)}
        run_dir = Path(block["run dir"])
        printed = shlex.split(block["worker"])
        assert printed == node_command(overrides, run_dir, on_gpu=True), name
        # Outside-in: the container, nsys inside it, then the worker's python.
        python = "python3" if overrides["container.image"] != "null" else sys.executable
        # In the container the image's PATH resolves nsys; on the host, the one found here.
        at = printed.index("nsys" if python == "python3" else str(nsys))
        assert printed[at + 1] == "profile" and f"--output={run_dir / 'profile'}" in printed
        assert printed[printed.index(python) :] == [python, "-m", "ghsweep.train.worker", str(run_dir)]
        assert at < printed.index(python)
        if python == "python3":
            assert printed[:3] == ["singularity", "exec", "--nv"] and printed.index(str(image)) == at - 1
        else:
            assert at == 0
        if overrides["profile"] == "auto":
            # The node picks: nsys with a GPU and nsys there, else the PyTorch profiler inside the worker.
            assert block["profile"].startswith(
                f"auto, {NODE_MARK}: Nsight Systems over the 3 steps after the measured ones"
            )
            assert shlex.split(block["else"]) == node_command(overrides, run_dir, on_gpu=False)
            assert str(nsys) not in block["else"]
        elif python == "python3":
            assert f"nsys {NODE_MARK} (inside the container: the first on the image's PATH)" in block["profile"]
            assert "else" not in block
        else:
            assert f"nsys {NODE_MARK} (the first on its PATH; here: {nsys})" in block["profile"]
            assert "else" not in block
        assert ("ncu_pass under ncu" in block["profile"]) == (overrides["profile"] == "nsys_ncu")
    assert_nothing_ran(tmp_path)


def test_in_process_dry_run_prints_the_nsys_command_the_job_runs(tmp_path):
    nsys = tool(tmp_path / "opt", "nsys")
    proc = run_cli(
        [
            "hydra/launcher=local",
            "experiment=smoke",
            "device=cuda",
            "profile=nsys",
            f"profile.nsys.path={nsys}",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ((name, block),) = combinations(proc.stdout).items()
    run_dir = Path(block["run dir"])
    overrides = {"experiment": "smoke", "device": "cuda", "profile": "nsys", "profile.nsys.path": str(nsys)}
    assert shlex.split(block["worker"]) == node_command(overrides, run_dir, on_gpu=True)
    assert shlex.split(block["worker"])[:2] == [str(nsys), "profile"]
    # A configured nsys is not the node's to choose.
    assert block["profile"].startswith(
        f"nsys: Nsight Systems over the 3 steps after the measured ones; nsys at {nsys} (profile.nsys.path)"
    )
    assert NODE_MARK not in block["profile"]
    assert block["launch"] == "in this process (hydra/launcher=local)"
    assert not list(tmp_path.rglob("worker.log")) and not (tmp_path / "mlflow.db").exists()


def test_without_nsys_here_the_node_resolves_it_and_what_never_runs_says_why(tmp_path, monkeypatch):
    # This machine has no nsys: the dry run shows the command with `nsys`, the node's PATH decides.
    path = [d for d in os.environ["PATH"].split(":") if not (Path(d) / "nsys").exists()]
    monkeypatch.setenv("PATH", ":".join(path))
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=local_slurm",
            "experiment=smoke",
            "profile=nsys,auto,torch",
            "device=auto,cpu",
            "dry_run=true",
        ],
        tmp_path,
    )
    # profile=nsys with device=cpu runs on no node: the dry run marks it and fails, as the sweep would refuse.
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "ghsweep: dry run: 1 combination(s) not runnable, marked above; the sweep would refuse to start"
    )
    found = {
        (o["profile"], o["device"]): b for o, b in ((overrides_of(n), b) for n, b in combinations(proc.stdout).items())
    }
    assert len(found) == 6

    command = shlex.split(found["nsys", "auto"]["worker"])
    assert command[:2] == ["nsys", "profile"] and command[-3:-1] == ["-m", "ghsweep.train.worker"]
    assert (
        f"nsys {NODE_MARK} (the first on its PATH; none on PATH here, so shown as `nsys`)"
        in found["nsys", "auto"]["profile"]
    )
    same_dir = found["auto", "auto"]["worker"].replace(
        found["auto", "auto"]["run dir"], found["nsys", "auto"]["run dir"]
    )
    assert shlex.split(same_dir) == command
    assert found["auto", "auto"]["profile"].startswith(f"auto, {NODE_MARK}:")

    # Decided by the config alone: no node mark, and the very command (or error) the job would have.
    with pytest.raises(ConfigError) as refused:
        resolve(compose_typed("experiment=smoke", "profile=nsys").profile, on_gpu=False, device="cpu")
    assert found["nsys", "cpu"]["worker"] == f"(not runnable) {refused.value}"
    for profile, device in (("auto", "cpu"), ("torch", "auto"), ("torch", "cpu")):
        block = found[profile, device]
        assert NODE_MARK not in block["profile"] and "else" not in block
        overrides = {"hydra/launcher": "local_slurm", "experiment": "smoke", "profile": profile, "device": device}
        assert shlex.split(block["worker"]) == node_command(overrides, Path(block["run dir"]), on_gpu=False)
    assert (
        found["auto", "cpu"]["profile"]
        == "auto: the PyTorch profiler inside the worker, the 3 steps after the measured ones (no GPU in this run, device=cpu)"
    )
    assert_nothing_ran(tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [
        ["device=auto", "profile=auto"],  # two plans: the node with a GPU and nsys, and without
        ["device=auto", "profile=nsys", "backend.gpus_per_node=1"],
        ["device=cpu", "profile=torch", "worker.timeout_min=5"],
        ["device=cpu", "profile=none", "backend.gpus_per_node=2", "peft=none"],
    ],
)
def test_the_dry_run_plan_is_the_plan_the_job_makes_on_the_node(tmp_path, monkeypatch, overrides):
    """One builder: every field of a dry run's plan (worker command, world, data parallelism, profiler,
    timeout) is what the job decides on a node with a GPU (and, for a second plan, without), bar the
    GPU's facts, which only the node has."""
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "nsys")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cfg = compose_config("experiment=smoke", *overrides)
    planned, config = dry_run_plans(cfg, tmp_path, "a=1", ["a=1"], on_slurm=False)
    gpus = [NODE_GPU, None] if config.device != "cpu" else [None]
    on_nodes = [node_plan(cfg, tmp_path, "a=1", ["a=1"], gpu, slurm_tasks=None)[0] for gpu in gpus[: len(planned)]]
    assert planned == [dataclasses.replace(plan, gpu=None) for plan in on_nodes]
    assert planned[0].worker_command[-3:] == ["-m", "ghsweep.train.worker", str(tmp_path)]
    assert len(planned) == (2 if overrides[:2] == ["device=auto", "profile=auto"] else 1)


def test_a_trial_s_prune_bar_is_in_its_plan(tmp_path):
    """The tune sweeper sets tune.prune_below_tokens_per_s for each trial; the plan carries it to the worker."""
    cfg = compose_config("experiment=smoke", "+tune.prune_below_tokens_per_s=1500")
    (planned,), _ = dry_run_plans(cfg, tmp_path, "a=1", ["a=1"], on_slurm=False)
    on_node, _ = node_plan(cfg, tmp_path, "a=1", ["a=1"], None, slurm_tasks=None)
    assert planned.prune_below_tokens_per_s == on_node.prune_below_tokens_per_s == 1500
    (outside_a_study,), _ = dry_run_plans(compose_config("experiment=smoke"), tmp_path, "a=1", ["a=1"], on_slurm=False)
    assert outside_a_study.prune_below_tokens_per_s is None


def test_a_dry_run_of_a_backend_that_is_none_says_its_refusal_in_the_worker_line(tmp_path):
    cfg = compose_config("experiment=smoke", "backend.name=bogus", "dry_run=true")
    text = describe(0, "backend.name=bogus", tmp_path / "0", ["backend.name=bogus"], cfg, "in this process")
    assert "(not runnable) backend=bogus: not an accepted value; accepted: torch, nemo, automodel" in text
