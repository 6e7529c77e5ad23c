#!/usr/bin/env bash
# The three backends side by side on one GPU, in one sweep: Llama-2-7B shape (random weights), seq 4096,
# micro-batch 1, LoRA, bf16, document-masked packing of the same dolly records on every backend.
#   OUT=results bash benchmarks/backends.sh [more overrides, e.g. train.max_steps=20]
# Writes $OUT/backends.json (rows as in h200_torch_backend.json), the sweep's log and comparison.
# NeMo and NeMo AutoModel must import in this interpreter; a backend that fails is a FAILED row
# with its error, the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-backends-out}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
args=(-m backend=torch,nemo,automodel model=llama2_7b peft=lora precision=bf16 data.packing_mask=document
      train.seq_length=4096 train.micro_batch_size=1 train.max_steps=12 train.warmup_steps=4 profile=none
      hydra.sweep.dir="$work/sweep" tracking.uri="sqlite:///$work/mlflow.db" "$@")
python3 -m ghsweep "${args[@]}" > "$out/backends.log" 2>&1
status=$?
cp "$work/sweep/comparison/comparison.md" "$out/" 2>/dev/null
python3 - "$work/sweep" "$status" "python -m ghsweep ${args[*]}" > "$out/backends.json" <<'PY'
import json, sys
from pathlib import Path
import yaml
sweep, status, command = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = {}
for run_dir in sorted(p for p in sweep.iterdir() if (p / "config.yaml").exists()):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    backend = cfg["backend"]["name"]
    summary = run_dir / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        m = s["metrics"]
        rows[backend] = {"row": backend, **{k: m.get(k) for k in ("step_time_ms", "tokens_per_s", "peak_mem_gb", "mfu",
                                                                  "tflops_per_gpu", "final_loss")},
                         "flops_per_token": s["info"].get("flops_per_token"), "device_name": s["info"].get("device_name"),
                         "ok": True}
    else:
        error = run_dir / "worker_error.json"
        rows[backend] = {"row": backend, "ok": False,
                         "error": json.loads(error.read_text())["message"] if error.exists() else "no summary.json"}
print(json.dumps({"command": command.replace(str(sweep.parent), "WORK_DIR"), "exit_status": status,
                  "workload": "Llama-2-7B shape, random weights, seq 4096, micro-batch 1, LoRA r=16 on all 7 projections, "
                              "bf16, dolly_synthetic packed with a document mask",
                  "rows": rows}, indent=1))
PY
python3 - "$out/backends.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(f"{'backend':<10} {'ok':<5} {'step ms':>8} {'tokens/s':>9} {'MFU':>6} {'peak GiB':>9}  error")
for r in rows.values():
    f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"
    print(f"{r['row']:<10} {str(r['ok']):<5} {f('step_time_ms', '8.1f'):>8} {f('tokens_per_s', '9.0f'):>9} "
          f"{f('mfu', '6.3f'):>6} {f('peak_mem_gb', '9.1f'):>9}  {r.get('error', '')[:120]}")
PY
