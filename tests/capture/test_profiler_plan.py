"""Which profiler a run gets, the nsys command line, and profile=torch end to end on CPU."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ghsweep.capture import profiler_plan
from ghsweep.capture.profiler_plan import (
    plans_from_config,
    profiler_prefix,
    resolve,
    session_capture,
    sweep_session_launch,
)
from ghsweep.config.schema import ProfileSchema, typed_section
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_plan import ProfilePlan, RunPlan, World
from ghsweep.launch.run_planner import node_plan
from tests.support.cli import run_cli
from tests.support.compose import compose_config, compose_typed
from tests.support.mlflow_records import MlflowRecords, sqlite_uri
from tests.support.stand_ins import NODE_GPU, script


def fake_tool(tmp_path: Path, name: str) -> str:
    """An executable file standing in for an installed nsys/ncu (only its path is used here)."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_auto_is_the_default_and_falls_back_to_torch_without_gpu(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    config = compose_typed()
    assert config.profile.name == "auto"
    plan = resolve(config.profile, on_gpu=False, device="cpu")
    assert plan.used == "torch" and "no GPU" in plan.note
    plan = resolve(config.profile, on_gpu=True, device="cuda")
    assert plan.used == "torch" and "nsys not found" in plan.note


def test_requested_nsys_missing_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"^profile=nsys: nsys not found on PATH; .*accepted here: profile=torch"):
        resolve(compose_typed("profile=nsys").profile, on_gpu=True, device="cuda")
    with pytest.raises(ConfigError, match=r"^profile=nsys_ncu: Nsight Systems traces CUDA and this run has no GPU"):
        resolve(compose_typed("profile=nsys_ncu").profile, on_gpu=False, device="cpu")


def test_ncu_missing_for_nsys_ncu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    config = compose_typed("profile=nsys_ncu", f"profile.nsys.path={fake_tool(tmp_path, 'nsys')}")
    with pytest.raises(ConfigError, match=r"^profile=nsys_ncu: ncu not found on PATH"):
        resolve(config.profile, on_gpu=True, device="cuda")
    config = compose_typed(
        "profile=nsys_ncu", f"profile.nsys.path={tmp_path / 'nsys'}", f"profile.ncu.path={fake_tool(tmp_path, 'ncu')}"
    )
    plan = resolve(config.profile, on_gpu=True, device="cuda")
    assert plan.used == "nsys" and plan.ncu and plan.ncu_path.endswith("ncu")


def test_nsys_command_records_the_capture_window(tmp_path):
    nsys = fake_tool(tmp_path, "nsys")
    config = compose_typed(
        "profile=nsys", f"profile.nsys.path={nsys}", "memory=unified", "profile.nsys.extra_args=['--sample=none']"
    )
    command = profiler_prefix(config, tmp_path, resolve(config.profile, on_gpu=True, device="cuda"), World())
    assert command[:2] == [nsys, "profile"]
    assert "--trace=cuda,nvtx" in command
    assert "--capture-range=cudaProfilerApi" in command and "--capture-range-end=stop" in command
    assert "--cuda-um-gpu-page-faults=true" in command  # um_page_faults=auto with memory=unified
    assert f"--output={tmp_path / 'profile'}" in command and command[-1] == "--sample=none"
    assert profiler_prefix(config, tmp_path, ProfilePlan("torch", "torch"), World()) == []


def test_plans_from_config_are_the_plans_the_node_makes(tmp_path, monkeypatch):
    # A node with a GPU, nsys and ncu on its PATH: the dry run's plans are exactly the node's.
    fake_tool(tmp_path, "nsys"), fake_tool(tmp_path, "ncu")
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("nsys", "nsys_ncu"):
        profile = compose_typed(f"profile={name}").profile
        assert plans_from_config(profile, "auto") == [resolve(profile, on_gpu=True, device="auto")]
    auto = compose_typed("profile=auto").profile
    assert plans_from_config(auto, "cuda:1") == [
        resolve(auto, on_gpu=True, device="cuda:1"),
        resolve(auto, on_gpu=False, device="cuda:1"),
    ]
    # A CPU run: the config alone decides, as the node would, errors included.
    for name in ("auto", "torch", "none"):
        profile = compose_typed(f"profile={name}").profile
        assert plans_from_config(profile, "cpu") == [resolve(profile, on_gpu=False, device="cpu")]
    with pytest.raises(ConfigError, match=r"^profile=nsys: Nsight Systems traces CUDA and this run has no GPU"):
        plans_from_config(compose_typed("profile=nsys").profile, "cpu")


def test_plans_from_config_leave_the_profiler_path_to_the_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    (plan,) = plans_from_config(compose_typed("profile=nsys_ncu").profile, "auto")
    assert (plan.used, plan.nsys_path, plan.ncu, plan.ncu_path) == ("nsys", "nsys", True, "ncu")
    # A configured path is the node's, whether or not it exists here.
    (plan,) = plans_from_config(compose_typed("profile=nsys", "profile.nsys.path=/opt/nsys/bin/nsys").profile, "auto")
    assert plan.nsys_path == "/opt/nsys/bin/nsys"
    assert profiler_prefix(compose_typed("profile=nsys"), tmp_path, plan, World())[:2] == [
        "/opt/nsys/bin/nsys",
        "profile",
    ]


def test_profile_nsys_on_a_machine_without_gpu_fails_before_training(tmp_path):
    # The plan the job makes on a node without a GPU, before any worker; tests/launch/test_precheck.py
    # runs the CLI through a single run refused there.
    with pytest.raises(ConfigError, match=r"^profile=nsys: Nsight Systems traces CUDA and this run has no GPU"):
        node_plan(compose_config("experiment=smoke", "profile=nsys"), tmp_path, "run", [], None, slurm_tasks=None)
    assert not list(tmp_path.iterdir())


def test_profile_torch_end_to_end_on_cpu(tmp_path):
    proc = run_cli(
        ["experiment=smoke", "profile=torch", "train.max_steps=5", "capture.start_step=2", "capture.num_steps=2"],
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = next(tmp_path.glob("outputs/*/*"))
    analysis = json.loads((run_dir / "profile_analysis.json").read_text())
    assert analysis["source"]["kind"] == "torch" and analysis["source"]["device"] == "cpu"
    # Both captured steps, one of them maybe taken for warm-up on a busy machine (a CPU's step times vary).
    assert sorted(analysis["window"]["warmup_steps"] + analysis["window"]["steps"]) == [2, 3]
    assert analysis["top_kernels"] and analysis["top_kernels"][0]["name"].startswith("aten::")
    assert analysis["phases_ms_per_step"]["forward"] > 0

    records = MlflowRecords(sqlite_uri(tmp_path))
    (run,) = records.runs("run")
    assert run.data.tags["ghsweep.profile_used"] == "torch"
    files = {a.path for a in records.client.list_artifacts(run.info.run_id, "profile")}
    assert {"profile/torch_trace.json", "profile/profile_report.md", "profile/top_kernels.md"} <= files


@pytest.mark.parametrize(
    "override,message",
    [
        ("profile.nsys.trace=[cuda,gpu]", "profile.nsys.trace=gpu: not an accepted value; accepted: cuda, nvtx"),
        ("profile.ncu.top_k=0", "profile.ncu.top_k=0: must be an integer >= 1"),
        ("profile.artifact_max_mb=-1", "profile.artifact_max_mb=-1: must be a number >= 0"),
    ],
)
def test_bad_profile_options_are_one_line_errors(override, message):
    from ghsweep.config.validate import validate

    with pytest.raises(ConfigError) as err:
        validate(compose_config("profile=nsys_ncu", override, "device=cpu"), None)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_ncu_pass_profiles_a_few_launches_of_each_top_kernel():
    """One launch per launch configuration of the top-5 kernels (7 on the shipped clean run, where a
    step launches them 58 times), bounded in all; never every launch of a step."""
    from ghsweep.capture import nsight_commands
    from ghsweep.profile.analysis import analyze
    from ghsweep.profile.pipeline import NCU_MAX_LAUNCHES, ncu_plan

    top = analyze(Path(__file__).parents[1] / "data" / "profiles" / "clean" / "profile.sqlite").top_kernels
    assert [k["launch_configs"] for k in top] == [2, 1, 1, 2, 1]
    count, per_config, words = ncu_plan(top)
    assert (count, per_config) == (1, True) and "~7 launches" in words
    command = nsight_commands.ncu_command("ncu", Path("r.ncu-rep"), ["a", "b"], count, "roofline", (), per_config)
    assert command[command.index("--filter-mode") + 1] == "per-launch-config"
    assert command[command.index("--launch-count") + 1] == "1" and "--clock-control" in command
    many = [dict(k, launch_configs=40) for k in top]
    assert ncu_plan(many)[:2] == (NCU_MAX_LAUNCHES, False)
    assert "--filter-mode" not in nsight_commands.ncu_command(
        "ncu", Path("r.ncu-rep"), ["a"], NCU_MAX_LAUNCHES, "roofline"
    )


@pytest.mark.parametrize(("start_step", "first"), [("4", 4), ("auto", 7)])  # auto: the last 3 of 10 steps
@pytest.mark.cli  # the job starts the pass's worker
def test_the_ncu_pass_trains_the_run_s_own_config_for_one_captured_step(tmp_path, start_step, first):
    """The pass's worker reads the run's config.yaml (the composed config with the real values), with
    one captured step and the steps up to it (never measuring on past them), and the run's plan moved
    to the pass's folder."""
    from ghsweep.core.run_dir import CONFIG, NCU_CSV, NCU_REPORT
    from ghsweep.launch.job import write_worker_config
    from ghsweep.launch.run_planner import dry_run_plans
    from ghsweep.profile.pipeline import ncu_pass

    ncu = script(tmp_path / "tools", "ncu", "#!/bin/sh\necho 'ID,Kernel Name'\n")
    cfg = compose_config(
        "profile=nsys_ncu",
        "device=auto",
        f"profile.nsys.path={fake_tool(tmp_path, 'nsys')}",
        f"profile.ncu.path={ncu}",
        f"capture.start_step={start_step}",
        "+model.hf_token=hf_s3cr3t_value",
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_worker_config(cfg, run_dir)
    (run,), config = dry_run_plans(cfg, run_dir, "run", [], on_slurm=False)
    passes = []

    def run_ncu_pass(command: list[str], work: Path) -> int:
        passes.append((command, OmegaConf.load(work / CONFIG), RunPlan.load(work)))
        (work / NCU_REPORT).touch()
        return 0

    clean = Path(__file__).parents[1] / "data" / "profiles" / "clean" / "profile.sqlite"
    csv_path, info = ncu_pass(config, run, clean, run_ncu_pass)
    assert csv_path == run_dir / NCU_CSV and csv_path.read_text() == "ID,Kernel Name\n"
    ((command, short, plan),) = passes
    assert command[0] == str(ncu) and command[-3:] == ["-m", "ghsweep.train.worker", str(run_dir / "ncu_pass")]
    expected = OmegaConf.load(run_dir / CONFIG)
    assert cfg.train.max_steps == 10
    expected.capture.start_step, expected.capture.num_steps = first, 1
    expected.train.max_steps, expected.train.measure = first + 2, False
    assert short == expected and short.model.hf_token == "hf_s3cr3t_value"
    assert plan == dataclasses.replace(run, run_dir=str(run_dir / "ncu_pass"))
    assert len(info["kernels"]) <= config.profile.ncu.top_k


def test_a_forked_worker_is_recorded_by_an_nsys_session_with_the_same_capture(tmp_path):
    """The pre-imported worker runs under `nsys launch` and each forked worker is one `nsys start`
    collection: between them they say exactly what `nsys profile` says for a worker started from its
    command, plus the tracing of forked children."""
    nsys = fake_tool(tmp_path, "nsys")
    config = compose_typed(
        "profile=nsys",
        f"profile.nsys.path={nsys}",
        "memory=unified",
        "profile.nsys.gpu_metrics=true",
        "profile.nsys.extra_args=['--sample=none','--cpuctxsw=none','--cuda-memory-usage=true']",
    )
    plan = resolve(config.profile, on_gpu=True, device="cuda")
    session = session_capture(config, tmp_path, plan, World())
    profile = profiler_prefix(config, tmp_path, plan, World())
    assert session is not None
    assert session.launch[:2] == [nsys, "launch"] and session.start[:2] == [nsys, "start"]
    assert sorted(session.launch[2:] + session.start[2:]) == sorted([*profile[2:], "--trace-fork-before-exec=true"])
    # How a program is traced is the session's for its life; what a collection records is each run's.
    assert "--cuda-um-gpu-page-faults=true" in session.launch and "--cuda-memory-usage=true" in session.launch
    assert f"--output={tmp_path / 'profile'}" in session.start and "--sample=none" in session.start
    assert "--gpu-metrics-devices=cuda-visible" in session.start
    # Only `nsys profile` takes what neither command knows: those runs start from their command.
    for extra in ("['-s','none']", "['--stats=true','--duration=5']"):
        odd = compose_typed("profile=nsys", f"profile.nsys.path={nsys}", f"profile.nsys.extra_args={extra}")
        assert session_capture(odd, tmp_path, plan, World()) is None


def test_the_sweep_guesses_its_nsys_session_from_its_own_profile(tmp_path, monkeypatch):
    nsys = fake_tool(tmp_path, "nsys")
    config = compose_typed("profile=nsys", f"profile.nsys.path={nsys}")
    monkeypatch.setattr(profiler_plan, "probe_gpu", lambda: NODE_GPU)
    launch = sweep_session_launch(config.profile, "default", "auto")
    # The sweep's callback gets its profile as composed, before any combination is validated.
    as_composed = compose_config("profile=nsys", f"profile.nsys.path={nsys}").profile
    assert sweep_session_launch(typed_section(ProfileSchema, as_composed), "default", "auto") == launch
    assert (
        launch == session_capture(config, tmp_path, resolve(config.profile, on_gpu=True, device="auto"), World()).launch
    )
    # No GPU, a CPU device or another profiler: no session (the combinations' plans say the same).
    assert sweep_session_launch(config.profile, "default", "cpu") == []
    assert sweep_session_launch(compose_typed("profile=torch").profile, "default", "auto") == []
    monkeypatch.setattr(profiler_plan, "probe_gpu", lambda: None)
    assert sweep_session_launch(config.profile, "default", "auto") == []  # profile=nsys refused without a GPU
