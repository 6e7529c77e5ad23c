"""One combination on several processes: the real CLI starts the worker under torchrun (gloo on CPU),
rank 0 records the run in MLflow with every rank's step times; the dry run shows the torchrun and
srun lines; a world the launch cannot give is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ghsweep.config.parallelism import world_of
from ghsweep.core.errors import ConfigError
from ghsweep.launch.world_check import check_world
from tests.support.cli import run_cli
from tests.support.compose import compose_typed
from tests.support.mlflow_records import MlflowRecords, sqlite_uri

SMOKE = ["experiment=smoke", "train.max_steps=4", "train.seq_length=64", "train.log_every=2", "train.warmup_steps=1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, object]:
    """LoRA (DDP) and full fine-tuning (FSDP2), each on 1 and on 2 gloo processes, in one sweep."""
    cwd = tmp_path_factory.mktemp("world")
    # Measuring past max_steps (4) to the step budget (6): with two ranks, rank 0 decides for both.
    measuring = ["train.measure=true", "train.measure_ci_pct=0.001", "train.measure_max_steps=6"]
    proc = run_cli(
        ["-m", *SMOKE, *measuring, "peft=lora,none", "backend.gpus_per_node=1,2", "hydra.sweep.dir=sweep"], cwd
    )
    return cwd, proc


def test_two_processes_train_under_torchrun_and_rank_0_records(sweep):
    cwd, proc = sweep
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = MlflowRecords(sqlite_uri(cwd))
    runs = {(r.data.params["peft"], r.data.params["backend.gpus_per_node"]): r for r in records.runs("run")}
    assert set(runs) == {("lora", "1"), ("lora", "2"), ("none", "1"), ("none", "2")}
    client = records.client
    for (peft, gpus), run in runs.items():
        assert run.info.status == "FINISHED", run.data.tags.get("ghsweep.error")
        m = run.data.metrics
        assert m["world_size"] == int(gpus)
        # The global batch: every rank trains micro_batch_size blocks of seq_length tokens per step.
        assert m["tokens_per_s"] == pytest.approx(1 * 64 * int(gpus) / (m["step_time_ms"] / 1000), rel=1e-6)
        assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / int(gpus))
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 6
        run_dir = Path(run.data.tags["ghsweep.run_dir"])
        assert json.loads((run_dir / "summary.json").read_text())["info"]["measure_stop"] == "step_budget"
        # One metrics.jsonl, written by rank 0 only.
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 6
        # FSDP2's shards (DTensors) are stepped by torchao's AdamW with stochastic rounding too.
        assert run.data.tags["ghsweep.optimizer"] == ("adamw" if peft == "lora" else "adamw_sr")
        if gpus == "2":
            assert run.data.tags["ghsweep.data_parallel"] == ("ddp" if peft == "lora" else "fsdp")
            # precision.reduce_dtype=auto on two ranks: the gradients' own dtype (train.distributed.reduce_dtype).
            assert run.data.tags["ghsweep.reduce_dtype"] == "param"
            per_rank = [float(t) for t in run.data.tags["ghsweep.rank_step_time_ms"].split()]
            assert len(per_rank) == 2
            assert m["slowest_rank"] == per_rank.index(max(per_rank))
            assert m["slowest_rank_step_time_ms"] == pytest.approx(max(per_rank), abs=0.05)
            command = (run_dir / "ghsweep.log").read_text()
            assert "-m torch.distributed.run --standalone --nproc-per-node=2 --no-python" in command


def test_the_comparison_shows_scaling_efficiency(sweep):
    cwd, proc = sweep
    report = (cwd / "sweep" / "comparison" / "comparison.md").read_text()
    assert "tokens/s/GPU" in report and "scaling eff" in report
    runs = {
        (r.data.params["peft"], r.data.params["backend.gpus_per_node"]): r.data.metrics
        for r in MlflowRecords(sqlite_uri(cwd)).runs("run")
    }
    for peft in ("lora", "none"):
        expected = runs[(peft, "2")]["tokens_per_s"] / 2 / runs[(peft, "1")]["tokens_per_s"]
        row = next(line for line in report.splitlines() if re.search(rf"\| {peft} +\| 2 ", line))
        assert f"{expected:.2f}" in row


def test_local_dry_run_prints_the_torchrun_line(tmp_path):
    proc = run_cli(["-m", *SMOKE, "backend.gpus_per_node=3", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    worker = next(line for line in proc.stdout.splitlines() if line.strip().startswith("worker:"))
    assert re.search(
        r"-m torch\.distributed\.run --standalone --nproc-per-node=3 --no-python \S*python\S* -m "
        r"ghsweep\.train\.worker ",
        worker,
    )
    assert "ranks:   3 ranks on this machine" in proc.stdout


def test_slurm_dry_run_asks_for_nodes_and_tasks_and_prints_srun(tmp_path):
    proc = run_cli(
        [
            "-m",
            *SMOKE,
            "hydra/launcher=local_slurm",
            "backend.num_nodes=1,2",
            "backend.gpus_per_node=2",
            "profile=nsys",
            "capture.start_step=1",  # the profiler's window inside the 4 steps
            "capture.num_steps=2",
            "device=cuda",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    blocks = proc.stdout.split("\n#")
    two_nodes = next(b for b in blocks if "backend.num_nodes=2" in b.splitlines()[0])
    assert "--nodes=2" in two_nodes and "--ntasks-per-node=2" in two_nodes and "--gpus-per-node=2" in two_nodes
    assert "2 node(s) x 2 tasks = 4 ranks" in two_nodes and "`srun --unbuffered" in two_nodes
    # srun starts the ranks: the worker line is one task's, with no torchrun, and its own nsys report.
    worker = next(line for line in two_nodes.splitlines() if line.strip().startswith("worker:"))
    assert "torch.distributed.run" not in worker and "profile_rank%q{RANK}" in worker
    one_node = next(b for b in blocks if "backend.num_nodes=1" in b.splitlines()[0])
    assert "--nodes=1" in one_node and "--ntasks-per-node=2" in one_node


@pytest.mark.parametrize(
    "overrides,on_gpu,visible,slurm,message",
    [
        (
            ["backend.num_nodes=2"],
            False,
            0,
            False,
            "backend.num_nodes=2: several nodes need a SLURM launch profile (hydra/launcher=local_slurm, gh200 or your "
            "site's); this launch runs on one machine; accepted here: 1",
        ),
        (
            ["backend.gpus_per_node=4"],
            True,
            2,
            False,
            "backend.gpus_per_node=4: this machine shows 2 GPU(s) to the run; accepted here: 1 to 2",
        ),
        (["backend.gpus_per_node=0"], False, 0, False, "backend.gpus_per_node=0: must be an integer >= 1"),
        (
            ["backend.data_parallel=zero"],
            False,
            0,
            False,
            "backend.data_parallel=zero: not an accepted value; accepted: auto, ddp, fsdp",
        ),
        (
            ["backend.gpus_per_node=2", "backend.data_parallel=fsdp", "precision=fp8"],
            True,
            2,
            False,
            "backend.data_parallel=fsdp with precision=fp8 and peft=lora: the frozen fp8 base weights are not sharded; "
            "accepted: backend.data_parallel=ddp (or auto)",
        ),
        (
            ["backend.gpus_per_node=2", "profile=nsys_ncu"],
            True,
            2,
            False,
            "profile=nsys_ncu with 2 ranks: the Nsight Compute pass reruns one process; accepted here: profile=nsys, "
            "torch, auto, none (or backend.gpus_per_node=1)",
        ),
        (
            ["backend.gpus_per_node=2", "train.optimizer_in_backward=true"],
            True,
            2,
            False,
            "train.optimizer_in_backward=true with 2 ranks: each tensor would step on its own rank's gradient before "
            "DDP/FSDP2 averages it; accepted here: false (or backend.gpus_per_node=1)",
        ),
        (
            ["backend.gpus_per_node=2", "peft=none", "train.optimizer=adamw8bit"],
            True,
            2,
            False,
            "train.optimizer=adamw8bit with 2 ranks under FSDP2: torchao's 8-bit states cannot step sharded "
            "(DTensor) weights (its compiled step needs aten.view.dtype, which they lack); accepted here: auto, "
            "adamw, adamw_sr (or backend.gpus_per_node=1)",
        ),
        (
            ["backend.gpus_per_node=2", "peft=none", "backend.fsdp_all_gather=copy_engine"],
            False,
            0,
            False,
            "backend.fsdp_all_gather=copy_engine on CPU: the copy engines' all-gather needs GPUs (NCCL's symmetric "
            "memory), where gloo's ranks have none; accepted here: nccl or auto",
        ),
        (
            ["precision.reduce_dtype=fp16"],
            False,
            0,
            False,
            "precision.reduce_dtype=fp16: not an accepted value; accepted: auto, fp32, param",
        ),
    ],
)
def test_a_world_the_launch_cannot_give_is_one_line(overrides, on_gpu, visible, slurm, message):
    with pytest.raises(ConfigError) as error:
        config = compose_typed(*overrides)
        check_world(config, world_of(config), on_gpu, visible, slurm)
    assert str(error.value) == message


def test_several_nodes_and_more_gpus_than_here_pass_on_slurm():
    config = compose_typed("backend.num_nodes=2", "backend.gpus_per_node=8")
    world = world_of(config)
    check_world(config, world, True, 1, slurm_task=True)
    assert (world.num_nodes, world.gpus_per_node, world.size) == (2, 8, 16)


def test_a_local_sweep_records_the_refused_world_and_goes_on(tmp_path):
    proc = run_cli(["-m", *SMOKE, "backend.num_nodes=1,2", "train.max_steps=2"], tmp_path)
    assert proc.returncode != 0
    assert "1 of 2 runs finished" in proc.stdout
    result = json.loads(next(tmp_path.glob("multirun/*/*/1/result.json")).read_text())
    assert result["status"] == "FAILED" and result["error"].startswith("backend.num_nodes=2: several nodes need")
