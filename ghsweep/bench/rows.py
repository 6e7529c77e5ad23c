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

from ghsweep.errors import one_line
from ghsweep.train.flops import ModelShape, add_throughput_metrics, flops_per_token

LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000)
LORA_RANK = 32  # peft's usual rank for this comparison; alpha = rank

# name -> (stack, settings)
ROWS: dict[str, dict] = {
    "usual_lora_defaults_eager": {"stack": "usual", "peft": "defaults", "compile": False},
    "usual_lora_bf16_eager": {"stack": "usual", "peft": "bf16_adapters", "compile": False},
    "usual_lora_bf16_compiled": {"stack": "usual", "peft": "bf16_adapters", "compile": True},
    "usual_full_eager": {"stack": "usual", "peft": "none", "compile": False},
    "usual_full_compiled": {"stack": "usual", "peft": "none", "compile": True},
    "usual_full_fp8_compiled": {"stack": "usual", "peft": "none", "compile": True, "float8": True},
    "ours_lora_bf16": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16"]},
    "ours_lora_bf16_cudnn": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16", "train.attention=cudnn"]},
    "ours_lora_bf16_document": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16",
                                                                "data.packing_mask=document"]},
    "ours_full_bf16": {"stack": "ours", "overrides": ["peft=none", "precision=bf16"]},
    "ours_lora_fp8": {"stack": "ours", "overrides": ["peft=lora", "precision=fp8", "precision.scaling=current"]},
    "ours_full_fp8": {"stack": "ours", "overrides": ["peft=none", "precision=fp8", "precision.scaling=current"]},
    "ours_lora_offload8": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16", "offload=on", "offload.num_layers=8"]},
    "ours_lora_unified": {"stack": "ours", "overrides": ["peft=lora", "precision=bf16", "memory=unified"]},
}


def run_ours(overrides: list[str], seq: int, steps: int, warmup: int, layers: int) -> dict:
    from hydra import compose, initialize_config_dir

    from ghsweep.train.worker import load_backend

    conf = Path(__file__).resolve().parents[2] / "conf"
    lora = [f"peft.r={LORA_RANK}", f"peft.alpha={LORA_RANK}"] if "peft=lora" in overrides else []
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=llama2_7b", f"model.num_layers={layers}", "device=cuda", "profile=none",
            f"train.seq_length={seq}", "train.micro_batch_size=1", f"train.max_steps={steps}",
            f"train.warmup_steps={warmup}", f"train.log_every={steps}", "train.lr=1e-5",
            # The usual stack trains one causal block per sequence; do the same work here.
            "data.packing_mask=causal", *lora, *overrides,
        ])
    backend, managed = load_backend(cfg)
    with tempfile.TemporaryDirectory() as run_dir:
        summary = backend.train(cfg, Path(run_dir), managed)
    m = summary["metrics"]
    return {"step_time_ms": m["step_time_ms"], "tokens_per_s": m["tokens_per_s"], "peak_mem_gb": m["peak_mem_gb"],
            "tflops_per_gpu": m["tflops_per_gpu"], "mfu": m.get("mfu"), "info": summary["info"]}


def run_usual(settings: dict, seq: int, steps: int, warmup: int, layers: int) -> dict:
    import torch

    from ghsweep.bench.usual_stack import train_steps

    shape = ModelShape(**{**LLAMA2_7B, "num_layers": layers})
    times, peak = train_steps(shape, seq, steps, settings["peft"], settings["compile"], settings.get("float8", False),
                              LORA_RANK)
    step_ms = statistics.median(times[warmup:])
    row = {"step_time_ms": step_ms, "tokens_per_s": seq / (step_ms / 1000), "peak_mem_gb": peak, "mfu": None}
    lora = settings["peft"] != "none"
    add_throughput_metrics(row, flops_per_token(shape, seq, LORA_RANK if lora else None), torch.cuda.get_device_name(),
                           "fp8" if settings.get("float8") else "bf16")
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
        runner = run_ours if settings["stack"] == "ours" else run_usual
        result = runner([*settings["overrides"], *args.ours_override] if settings["stack"] == "ours" else settings,
                        args.seq, args.steps, args.warmup, args.layers)
        result["ok"] = True
    except Exception as exc:  # a row that fails is reported in the table, not fatal to the benchmark
        traceback.print_exc()
        result = {"ok": False, "error": one_line(exc)}
    args.out.write_text(json.dumps({"row": args.name, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
