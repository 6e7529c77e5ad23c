"""The worker command inside a Singularity/Apptainer container, built as an argument list.

No container runtime is installed where these tests run; the argument list is the edge they test
up to (`apptainer exec` itself runs on the cluster).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from ghsweep.capture import nsight_commands
from ghsweep.config.schema import typed
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import NCU_PASS_DIR, NSYS_REPORT, NSYS_SQLITE, RUN_PLAN
from ghsweep.core.run_plan import RunPlan
from ghsweep.launch.container import check_container, container_env, container_prefix, tool_finder
from ghsweep.launch.run_planner import dry_run_plans, node_plan
from ghsweep.profile import nsight_exports
from tests.support.cli import run_cli
from tests.support.compose import compose_config, compose_typed
from tests.support.stand_ins import NODE_GPU, fake_runtime


def planned_command(cfg: DictConfig, run_dir: Path) -> list[str]:
    """The worker command of the run's plan, as a local launch makes it from the config."""
    plans, _ = dry_run_plans(cfg, run_dir, "run", [], on_slurm=False)
    return plans[0].worker_command


def test_no_image_runs_the_worker_on_the_host(tmp_path):
    cfg = compose_config("experiment=smoke")
    assert planned_command(cfg, tmp_path) == [sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)]


def test_gh200_profile_wraps_the_worker_in_the_container_with_binds_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GHSWEEP_IMAGE", "/images/ghsweep nemo.sif")
    cfg = compose_config("hydra/launcher=gh200", "experiment=smoke")
    command = planned_command(cfg, tmp_path)
    image = command.index("/images/ghsweep nemo.sif")  # a path with a space stays one argument
    assert command[:3] == ["singularity", "exec", "--nv"]
    prefix = command[:image]
    assert ["--bind", str(tmp_path.resolve())] == prefix[3:5]
    assert ["--bind", str(Path.home())] == prefix[5:7]
    assert ["--env", "HF_HUB_OFFLINE=1"] == prefix[7:9]
    assert command[image + 1 :] == ["python3", "-m", "ghsweep.train.worker", str(tmp_path)]


def test_binds_env_and_runtime_from_the_command_line(tmp_path):
    config = compose_typed(
        "experiment=smoke",
        "container.image=/c.sif",
        "container.runtime=singularity",
        "container.nv=false",
        "container.binds=[/lustre/data:/data:ro]",
        "+container.env.MSG='a b;rm -rf /'",
    )
    assert container_prefix(config, tmp_path) == [
        "singularity",
        "exec",
        "--bind",
        str(tmp_path.resolve()),
        "--bind",
        "/lustre/data:/data:ro",
        "--env",
        "MSG=a b;rm -rf /",
        "/c.sif",
    ]


def test_unknown_runtime_is_a_one_line_error(tmp_path):
    cfg = compose_config("experiment=smoke", "container.image=/c.sif", "container.runtime=docker")
    with pytest.raises(
        ConfigError,
        match=r"^container.runtime=docker: not a container runtime; accepted: apptainer, singularity, pyxis$",
    ):
        planned_command(cfg, tmp_path)


def test_missing_image_or_runtime_fails_before_training(tmp_path, monkeypatch):
    missing = compose_typed("experiment=smoke", f"container.image={tmp_path / 'none.sif'}")
    with pytest.raises(ConfigError, match=r"^container.image=.*none.sif: no such file on this node"):
        check_container(missing)
    image = tmp_path / "c.sif"
    image.write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path))  # a node without apptainer
    no_runtime = compose_typed("experiment=smoke", f"container.image={image}", "container.runtime=apptainer")
    with pytest.raises(ConfigError, match=r"^container.runtime=apptainer: not found on PATH of this node"):
        check_container(no_runtime)


@pytest.mark.cli  # the job starts a worker
def test_profilers_are_looked_up_and_exported_inside_the_container(tmp_path, monkeypatch):
    # The host has the runtime but no nsys; the image brings nsys (not ncu), as NGC images bring theirs.
    host_bin, image = tmp_path / "host_bin", tmp_path / "ghsweep-nemo.sif"
    fake_runtime(host_bin)
    image_bin = Path(f"{image}.bin")
    image_bin.mkdir()
    (image_bin / "nsys").write_text(
        '#!/bin/sh\nfor a in "$@"; do case "$a" in --output=*) : > "${a#--output=}";; esac; done\n'
    )
    (image_bin / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{host_bin}:/usr/bin:/bin")
    image.touch()
    # device=auto: the run takes the node's GPU (smoke's default device is the CPU).
    cfg = compose_config(
        "hydra/launcher=gh200", "experiment=smoke", f"container.image={image}", "profile=nsys_ncu", "device=auto"
    )
    prefix = container_prefix(typed(cfg), tmp_path)
    find = tool_finder(prefix)
    assert find("nsys", None) == "nsys"
    assert find("nsys", str(image_bin / "nsys")) == str(image_bin / "nsys")
    assert find("ncu", None) is None and nsight_commands.find_tool("nsys", None) is None

    # The job's plan: nsys from the image, and ncu missing there is the one-line error before training.
    with pytest.raises(ConfigError, match=r"^profile=nsys_ncu: ncu not found on PATH"):
        node_plan(cfg, tmp_path, "run", [], NODE_GPU, slurm_tasks=None)
    planned, _ = node_plan(
        compose_config(
            "hydra/launcher=gh200", "experiment=smoke", f"container.image={image}", "profile=nsys", "device=auto"
        ),
        tmp_path,
        "run",
        [],
        NODE_GPU,
        slurm_tasks=None,
    )
    plan = planned.profile
    assert (plan.nsys_path, plan.tool_prefix) == ("nsys", prefix)

    # The export runs where the report was made: through the container, not on the host.
    report = tmp_path / NSYS_REPORT
    report.touch()
    assert nsight_exports.export_sqlite(plan.nsys_path, report, plan.tool_prefix) == tmp_path / NSYS_SQLITE
    with pytest.raises(FileNotFoundError):
        nsight_exports.export_sqlite(plan.nsys_path, report)


def test_torchrun_starts_one_container_per_rank(tmp_path):
    """Locally, as srun on SLURM: each rank is its own container process with the rank's environment."""
    cfg = compose_config("experiment=smoke", "container.image=/c.sif", "backend.gpus_per_node=2")
    command = planned_command(cfg, tmp_path)
    assert command[:6] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--no-python",
    ]
    assert command[6:9] == ["apptainer", "exec", "--nv"]
    assert command[-4:] == ["python3", "-m", "ghsweep.train.worker", str(tmp_path)]


# pyxis is a SLURM plugin and cannot be installed here: these tests go up to the srun line.
# A registry image with '#' is quoted for Hydra's override grammar.
PYXIS = ("container.runtime=pyxis", "container.image='nvcr.io#nvidia/nemo:25.09'")


def test_pyxis_runs_the_worker_as_an_srun_step_with_the_image_mounts_and_workdir(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    cfg = compose_config("experiment=smoke", *PYXIS, "container.binds=[/lustre/data:/data:ro,/home/me]")
    run_dir = str(tmp_path.resolve())
    assert planned_command(cfg, tmp_path) == [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--container-image=nvcr.io#nvidia/nemo:25.09",
        f"--container-mounts={run_dir},/lustre/data:/data:ro,/home/me",
        f"--container-workdir={run_dir}",
        "python3",
        "-m",
        "ghsweep.train.worker",
        str(tmp_path),
    ]
    # Inside a SLURM job the step stays on the task's own node.
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    assert container_prefix(typed(cfg), tmp_path)[4] == "--nodelist=node2"


def test_pyxis_keeps_container_env_values_and_secrets_off_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t_value")
    cfg = compose_config(
        "experiment=smoke", *PYXIS, "+container.env.HF_TOKEN=${oc.env:HF_TOKEN}", "+container.env.MODE=fast"
    )
    command = planned_command(cfg, tmp_path)
    assert "--container-env=HF_TOKEN,MODE" in command
    assert not [a for a in command if "hf_s3cr3t_value" in a or "fast" in a]
    assert container_env(typed(cfg)) == {"HF_TOKEN": "hf_s3cr3t_value", "MODE": "fast"}
    # The other runtimes take them as --env arguments, not through the environment.
    assert container_env(compose_typed("experiment=smoke", "container.image=/c.sif", "+container.env.MODE=fast")) == {}


def test_the_plan_holds_the_container_env_for_its_workers_and_never_writes_or_shows_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t_value")
    cfg = compose_config("experiment=smoke", *PYXIS, "+container.env.HF_TOKEN=${oc.env:HF_TOKEN}")
    plans, _ = dry_run_plans(cfg, tmp_path, "run", [], on_slurm=False)
    assert plans[0].worker_env == {"HF_TOKEN": "hf_s3cr3t_value"}
    plans[0].save(tmp_path)
    assert "hf_s3cr3t_value" not in (tmp_path / RUN_PLAN).read_text() + repr(plans[0])
    assert RunPlan.load(tmp_path).worker_env == {}


@pytest.mark.cli  # the job starts a worker
def test_the_worker_gets_the_container_env_in_its_environment(tmp_path):
    from ghsweep.launch.worker_process import run_worker

    program = "import os; print(os.environ['HF_TOKEN'])"
    exit = run_worker([sys.executable, "-c", program], tmp_path, None, env={"HF_TOKEN": "hf_s3cr3t_value"})
    assert exit.returncode == 0 and (tmp_path / "worker.log").read_text() == "hf_s3cr3t_value\n"


def test_pyxis_on_a_node_without_srun_or_with_a_missing_sqsh_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun here
    with pytest.raises(ConfigError, match=r"^container.runtime=pyxis: runs the worker with `srun --container-image"):
        check_container(compose_typed("experiment=smoke", *PYXIS))
    with pytest.raises(ConfigError, match=r"^container.image=/images/nemo.sqsh: no such file on this node"):
        check_container(
            compose_typed("experiment=smoke", "container.runtime=pyxis", "container.image=/images/nemo.sqsh")
        )
    with pytest.raises(ConfigError, match=r"^container.binds=/a,b: pyxis separates mounts with commas"):
        container_prefix(compose_typed("experiment=smoke", *PYXIS, "container.binds=['/a,b']"), tmp_path)


def test_an_unknown_runtime_is_refused_before_anything_is_recorded(tmp_path):
    proc = run_cli(["-m", "experiment=smoke", "container.image=/c.sif", "container.runtime=docker"], tmp_path)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[0]
        .endswith("container.runtime=docker: not a container runtime; accepted: apptainer, singularity, pyxis")
    ), proc.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_slurm_profile_with_pyxis_dry_runs_the_srun_line(tmp_path):
    proc = run_cli(["-m", "hydra/launcher=local_slurm", "experiment=smoke", *PYXIS, "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    worker = shlex.split(next(line for line in proc.stdout.splitlines() if line.strip().startswith("worker:")))
    assert worker[1:6] == [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--container-image=nvcr.io#nvidia/nemo:25.09",
    ]
    assert worker[7].startswith("--container-workdir=") and worker[8:11] == ["python3", "-m", "ghsweep.train.worker"]


def test_the_ncu_pass_runs_its_worker_in_its_folder_in_the_run_s_container(tmp_path):
    cfg = compose_config("experiment=smoke", "container.image=/c.sif", "profile=nsys_ncu", "device=auto")
    (plan,), config = dry_run_plans(cfg, tmp_path, "run", [], on_slurm=False)
    work = tmp_path / NCU_PASS_DIR
    assert plan.ncu_pass is not None and plan.ncu_pass.run_dir == str(work)
    assert plan.ncu_pass.command(["ncu", "--set=basic"]) == [
        *container_prefix(config, work),
        "ncu",
        "--set=basic",
        "python3",
        "-m",
        "ghsweep.train.worker",
        str(work),
    ]
    plan.save(tmp_path)
    assert RunPlan.load(tmp_path) == plan  # as the job's profile pipeline reads it
    # No ncu pass, no command for one.
    (plan,), _ = dry_run_plans(compose_config("experiment=smoke"), tmp_path, "run", [], on_slurm=False)
    assert plan.ncu_pass is None
