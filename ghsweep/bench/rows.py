"""One benchmark row in its own process: `python -m ghsweep.bench.rows NAME OUT.json [--layers N]`.

A fresh process per row keeps one row's compile caches, memory and crashes out of the next.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from ghsweep.config.schema import ConfigSchema, typed
from ghsweep.core.errors import one_line
from ghsweep.core.run_plan import ProfilePlan, RunPlan, World
from ghsweep.core.stats import STEP_METRICS, step_stats
from ghsweep.train.backends import backend_named
from ghsweep.train.dolly_data import PackedBlocks, load_blocks
from ghsweep.train.flops import ModelShape, add_throughput_metrics, flops_per_token
from ghsweep.train.packed_attention import attended_keys_per_token, document_ids
from ghsweep.train.tokenizer import ByteTokenizer

CONF = Path(__file__).resolve().parents[1] / "conf"  # the package's config (ghsweep/conf)

# name -> (stack, settings). Our rows are the CLI's groups with nothing else changed; the usual
# stack trains the same packed dolly blocks with peft at the same LoRA rank.
ROWS: dict[str, dict] = {
    "usual_lora_defaults_eager": {"stack": "usual", "peft": "defaults", "compile": False},
    "usual_lora_bf16_eager": {"stack": "usual", "peft": "bf16_adapters", "compile": False},
    "usual_lora_bf16_compiled": {"stack": "usual", "peft": "bf16_adapters", "compile": True},
    "usual_lora_bf16_compiled_document": {"stack": "usual", "peft": "bf16_adapters", "compile": True, "document": True},
    "usual_full_eager": {"stack": "usual", "peft": "none", "compile": False},
    "usual_full_compiled": {"stack": "usual", "peft": "none", "compile": True},
    "usual_full_fp8_compiled": {"stack": "usual", "peft": "none", "compile": True, "float8": True},
    "ours_lora_bf16": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16"]},
    "ours_lora_bf16_causal": {
        "stack": "ours",
        "overrides": ["peft=lora", "precision=bf16", "data.packing_mask=causal"],
    },
    "ours_full_bf16": {"stack": "ours", "overrides": ["peft=none", "precision=bf16"]},
    "ours_lora_fp8": {"stack": "ours", "overrides": ["peft=lora", "precision=fp8"]},
    "ours_full_fp8": {"stack": "ours", "overrides": ["peft=none", "precision=fp8"]},
    # Full fine-tuning's AdamW side by side (the default is adamw_sr): torch's fused AdamW, which drops
    # most of its updates to bf16 weights, and torchao's with 8-bit states.
    "ours_full_bf16_adamw": {"stack": "ours", "overrides": ["peft=none", "precision=bf16", "train.optimizer=adamw"]},
    "ours_full_bf16_adamw8bit": {
        "stack": "ours",
        "overrides": ["peft=none", "precision=bf16", "train.optimizer=adamw8bit"],
    },
    "ours_full_fp8_adamw": {"stack": "ours", "overrides": ["peft=none", "precision=fp8", "train.optimizer=adamw"]},
    "ours_lora_offload8": {
        "stack": "ours",
        "overrides": ["peft=lora", "precision=bf16", "offload=on", "offload.num_layers=8"],
    },
    "ours_lora_offload16": {
        "stack": "ours",
        "overrides": ["peft=lora", "precision=bf16", "offload=on", "offload.num_layers=16"],
    },
    "ours_lora_unified": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16", "memory=unified"]},
    # The documented low-memory setting (docs/gpu.md): the compiled layers keep half of their saved bytes
    # (the partitioner recomputes the rest in backward), and 18 layers park what they keep in host memory.
    "ours_lora_low_memory": {
        "stack": "ours",
        "overrides": [
            "peft=lora",
            "precision=bf16",
            "train.activation_memory_budget=0.5",
            "offload=on",
            "offload.num_layers=18",
        ],
    },
}


def compose_ours(overrides: list[str], seq: int, steps: int, warmup: int, layers: int) -> ConfigSchema:
    """The run config a user gets from the CLI with these overrides, at the benchmark's shape."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = compose(
            config_name="config",
            overrides=[
                "model=llama2_7b",
                f"model.num_layers={layers}",
                "device=cuda",
                "profile=none",
                f"train.seq_length={seq}",
                "train.micro_batch_size=1",
                f"train.max_steps={steps}",
                f"train.warmup_steps={warmup}",
                f"train.log_every={steps}",
                *overrides,
            ],
        )
    return typed(composed)


def document_lengths(position_ids: torch.Tensor) -> dict:
    """Mean and percentiles of the packed examples' lengths in tokens (padding excluded where it
    ends a block, as far as position ids tell)."""
    lengths = sorted(int(n) for row in document_ids(position_ids) for n in torch.bincount(row))
    pick = lambda q: lengths[min(len(lengths) - 1, int(q * len(lengths)))]  # noqa: E731
    return {
        "examples": len(lengths),
        "mean": statistics.fmean(lengths),
        "p10": pick(0.1),
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "max": lengths[-1],
    }


def run_ours(overrides: list[str], seq: int, steps: int, warmup: int, layers: int) -> dict:
    from ghsweep.train.unified_memory import setup_unified_memory

    config = compose_ours(overrides, seq, steps, warmup, layers)
    with tempfile.TemporaryDirectory() as run_dir:
        plan = one_gpu_plan(config, Path(run_dir))
        # Before the backend's imports touch CUDA, as the worker does.
        managed = setup_unified_memory(config.memory, plan.gpu) if config.memory.name == "unified" else None
        summary = backend_named(plan.backend).train(config, plan, Path(run_dir), managed)
    m = summary.metrics
    return {
        **{k: v for k, v in m.items() if k in STEP_METRICS},
        "peak_mem_gb": m["peak_mem_gb"],
        "tflops_per_gpu": m["tflops_per_gpu"],
        "mfu": m.get("mfu"),
        "info": summary.info,
    }


def one_gpu_plan(config: ConfigSchema, run_dir: Path) -> RunPlan:
    """The plan of a row: this process trains on this machine's first GPU, unprofiled."""
    from ghsweep.config.parallelism import data_parallel
    from ghsweep.core.gpu import probe_gpu

    return RunPlan(
        name=run_dir.name,
        run_dir=str(run_dir),
        overrides=[],
        backend=config.backend.name,
        device="cuda",
        gpu=probe_gpu(),
        world=World(),
        data_parallel=data_parallel(config),
        profile=ProfilePlan(requested="none", used="none"),
        container_prefix=[],
        worker_command=[],
        timeout_min=None,
    )


def default_blocks(config: ConfigSchema) -> PackedBlocks:
    """The packed blocks a run of `config` trains on (random weights: the byte tokenizer)."""
    return load_blocks(config, ByteTokenizer())


def run_usual(settings: dict, seq: int, steps: int, warmup: int, layers: int) -> dict:
    from ghsweep.bench.usual_stack import train_steps

    config = compose_ours([], seq, steps, warmup, layers)
    blocks = default_blocks(config)
    shape = ModelShape.of_model(config.model)
    lora = settings["peft"] != "none"
    times, peak = train_steps(
        shape,
        blocks,
        steps,
        settings["peft"],
        settings["compile"],
        settings.get("float8", False),
        config.peft if lora else None,
        settings.get("document", False),
    )
    # The worker's statistics (ghsweep.core.stats): the same steady steps, median and interval.
    row = {**step_stats(times, warmup).metrics(seq), "peak_mem_gb": peak, "mfu": None}
    keys = attended_keys_per_token(blocks.position_ids, settings.get("document", False))
    flops = flops_per_token(shape, keys, config.peft.r if lora else None)
    add_throughput_metrics(row, flops, torch.cuda.get_device_name(), "fp8" if settings.get("float8") else "bf16")
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=sorted(ROWS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--ours-override", action="append", default=[], help="extra config override for our rows")
    args = parser.parse_args(argv)
    settings = ROWS[args.name]
    try:
        sizes = (args.seq, args.steps, args.warmup, args.layers)
        if settings["stack"] == "ours":
            result = run_ours([*settings["overrides"], *args.ours_override], *sizes)
        else:
            result = run_usual(settings, *sizes)
        result["ok"] = True
    except Exception as exc:  # a row that fails is reported in the table, not fatal to the benchmark
        traceback.print_exc()
        result = {"ok": False, "error": one_line(exc)}
    args.out.write_text(json.dumps({"row": args.name, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
