"""The worker command inside a Singularity/Apptainer container, built as an argument list.

No container runtime is installed where these tests run; the argument list is the edge they test
up to (`apptainer exec` itself runs on the cluster).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ghsweep.core.errors import ConfigError
from ghsweep.launch.container import check_container, container_prefix, tool_finder
from ghsweep.launch.plan import node_plan
from ghsweep.launch.worker_process import worker_command
from ghsweep.profile import capture
from tests.conftest import compose_config
from tests.launch.stand_ins import NODE_GPU, fake_runtime


def test_no_image_runs_the_worker_on_the_host(tmp_path):
    cfg = compose_config("experiment=smoke")
    assert worker_command(cfg, tmp_path) == [sys.executable, "-m", "ghsweep.train.worker", str(tmp_path)]


def test_gh200_profile_wraps_the_worker_in_the_container_with_binds_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GHSWEEP_IMAGE", "/images/ghsweep nemo.sif")
    cfg = compose_config("hydra/launcher=gh200", "experiment=smoke")
    command = worker_command(cfg, tmp_path)
    image = command.index("/images/ghsweep nemo.sif")  # a path with a space stays one argument
    assert command[:3] == ["singularity", "exec", "--nv"]
    prefix = command[:image]
    assert ["--bind", str(tmp_path.resolve())] == prefix[3:5]
    assert ["--bind", str(Path.home())] == prefix[5:7]
    assert ["--env", "HF_HUB_OFFLINE=1"] == prefix[7:9]
    assert command[image + 1 :] == ["python3", "-m", "ghsweep.train.worker", str(tmp_path)]


def test_binds_env_and_runtime_from_the_command_line(tmp_path):
    cfg = compose_config(
        "experiment=smoke",
        "container.image=/c.sif",
        "container.runtime=singularity",
        "container.nv=false",
        "container.binds=[/lustre/data:/data:ro]",
        "+container.env.MSG='a b;rm -rf /'",
    )
    assert container_prefix(cfg, tmp_path) == [
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
        ConfigError, match=r"^container.runtime=docker: not a container runtime; accepted: apptainer, singularity$"
    ):
        worker_command(cfg, tmp_path)


def test_missing_image_or_runtime_fails_before_training(tmp_path, monkeypatch):
    missing = compose_config("experiment=smoke", f"container.image={tmp_path / 'none.sif'}")
    with pytest.raises(ConfigError, match=r"^container.image=.*none.sif: no such file on this node"):
        check_container(missing)
    image = tmp_path / "c.sif"
    image.write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path))  # a node without apptainer
    no_runtime = compose_config("experiment=smoke", f"container.image={image}", "container.runtime=apptainer")
    with pytest.raises(ConfigError, match=r"^container.runtime=apptainer: not found on PATH of this node"):
        check_container(no_runtime)


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
    prefix = container_prefix(cfg, tmp_path)
    find = tool_finder(prefix)
    assert find("nsys", None) == "nsys"
    assert find("nsys", str(image_bin / "nsys")) == str(image_bin / "nsys")
    assert find("ncu", None) is None and capture.find_tool("nsys", None) is None

    # The job's plan: nsys from the image, and ncu missing there is the one-line error before training.
    with pytest.raises(ConfigError, match=r"^profile=nsys_ncu: ncu not found on PATH"):
        node_plan(cfg, tmp_path, "run", [], NODE_GPU, slurm_tasks=None)
    plan = node_plan(
        compose_config(
            "hydra/launcher=gh200", "experiment=smoke", f"container.image={image}", "profile=nsys", "device=auto"
        ),
        tmp_path,
        "run",
        [],
        NODE_GPU,
        slurm_tasks=None,
    ).profile
    assert (plan.nsys_path, plan.tool_prefix) == ("nsys", prefix)

    # The export runs where the report was made: through the container, not on the host.
    report = tmp_path / capture.NSYS_REPORT
    report.touch()
    assert capture.export_sqlite(plan.nsys_path, report, plan.tool_prefix) == tmp_path / capture.NSYS_SQLITE
    with pytest.raises(FileNotFoundError):
        capture.export_sqlite(plan.nsys_path, report)


def test_torchrun_starts_one_container_per_rank(tmp_path):
    """Locally, as srun on SLURM: each rank is its own container process with the rank's environment."""
    cfg = compose_config("experiment=smoke", "container.image=/c.sif", "backend.gpus_per_node=2")
    command = worker_command(cfg, tmp_path, local_ranks=2)
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
