#!/usr/bin/env bash
# Which one-GPU run a two-GPU run's efficiency is taken against, on one machine with two GPUs: the same
# combinations (Llama-2-7B shape, seq 4096, micro-batch 1, LoRA and full bf16, no profiler, each run to
# its interval) as
#   alone      one GPU busy, the other idle (run before and after the rest: the machine's drift),
#   side by side  one one-GPU sweep on each GPU at once (two independent jobs: both GPUs busy),
#   2 GPUs     one sweep on both GPUs (DDP for LoRA, FSDP2 for full fine-tuning, the defaults).
#   OUT=results bash benchmarks/scaling_baselines.sh
# writes $OUT/scaling_baselines.json and prints each run's step and the two-GPU runs' per-GPU
# efficiency against each baseline last. All sweeps share one compile cache, so only the first compiles.
set -u
OUT=${OUT:?set OUT to the folder for the results}
WORK=${WORK:-/tmp/scaling_baselines}
KNOBS=${KNOBS:-peft=lora,none train.measure_max_steps=60}
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
sweep() {  # NAME GPUS_VISIBLE GPUS_PER_NODE
  # shellcheck disable=SC2086  # KNOBS holds several overrides on purpose
  CUDA_VISIBLE_DEVICES=$2 python3 -m ghsweep -m model=llama2_7b precision=bf16 $KNOBS train.seq_length=4096 \
    train.micro_batch_size=1 profile=none "backend.gpus_per_node=$3" "train.compile_cache_dir=$WORK/compile-cache" \
    "hydra.sweep.dir=$WORK/$1" "tracking.uri=sqlite:///$WORK/$1.db" > "$WORK/$1.log" 2>&1 || echo "$1: sweep exit $?"
}
sweep alone_before 0 1
sweep side_by_side_gpu0 0 1 & sweep side_by_side_gpu1 1 1 & wait
sweep two_gpus 0,1 2
sweep alone_after 0 1
python3 - "$WORK" "$OUT/scaling_baselines.json" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from scaling import rows

work, out = Path(sys.argv[1]), Path(sys.argv[2])
names = ["alone_before", "side_by_side_gpu0", "side_by_side_gpu1", "two_gpus", "alone_after"]
sweeps = {n: rows(work / n) for n in names}
out.write_text(json.dumps(sweeps, indent=2))
def combo(run): return " ".join(o for o in run["overrides"] if o.startswith("peft"))  # the combinations differ by peft
def per_gpu(name, c):
    found = [r["tokens_per_s_per_gpu"] for r in sweeps[name] if combo(r) == c and r["status"] == "FINISHED"]
    return found[0] if found else None
print(f"{'sweep':<20} {'combination':<12} {'step ms':>8} {'±%':>5} {'tok/s/GPU':>9}")
for n in names:
    for r in sweeps[n]:
        cells = (r["step_time_ms"], r["step_time_ms_ci_pct"], r["tokens_per_s_per_gpu"])
        print(f"{n:<20} {combo(r):<12} " + " ".join("-" if v is None else f"{v:{w}.{p}f}" for v, w, p in zip(cells, (8, 5, 9), (1, 2, 0))))
print(f"\n{'2-GPU efficiency':<12} {'vs alone before':>16} {'vs alone after':>15} {'vs side by side (mean of GPUs)':>31}")
for r in sweeps["two_gpus"]:
    c, two = combo(r), r["tokens_per_s_per_gpu"]
    side = [per_gpu(f"side_by_side_gpu{g}", c) for g in (0, 1)]
    bases = [per_gpu("alone_before", c), per_gpu("alone_after", c), sum(side) / 2 if None not in side else None]
    print(f"{c:<12} " + " ".join("-" if not (two and b) else f"{two / b:{w}.3f}" for b, w in zip(bases, (16, 15, 31))))
PY
