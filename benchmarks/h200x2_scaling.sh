#!/usr/bin/env bash
# Scaling of one combination from 1 to 2 GPUs on a machine with two GPUs, in ONE sweep through the CLI:
# Llama-2-7B shape, seq 4096, micro-batch 1 per GPU, LoRA bf16 (DDP) and full bf16 (FSDP2), each on
# 1 and on 2 GPUs, every run under Nsight Systems (one report per rank).
#   OUT=results PROFILES=tests/data/profiles/scaling_7b_2gpu bash benchmarks/h200x2_scaling.sh
# writes $OUT/h200x2_scaling.json (the runs, their tokens/s per GPU and scaling efficiency) and
# prints the table; then benchmarks/scaling_profiles.py keeps each run's nsys exports, trimmed and
# gzipped, in $PROFILES/<peft>_<N>gpu/ (default $OUT/profiles) with decomposition.json, and prints
# where the per-GPU throughput went from 1 to 2 GPUs. WORK (default /tmp/h200x2_scaling) keeps the
# sweep and its MLflow store. STEPS=10 makes it shorter (the capture is always the last 4th-2nd steps,
# the first of them the capture's warm-up: the analysis leaves out the step a capture began in).
set -u
OUT=${OUT:?set OUT to the folder for the results}
WORK=${WORK:-/tmp/h200x2_scaling}
PROFILES=${PROFILES:-$OUT/profiles}
STEPS=${STEPS:-14}
mkdir -p "$OUT" "$WORK"
# NVLink SHARP (multicast) stays off: not every machine allows it.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# KNOBS: what the sweep varies (default: LoRA and full fine-tuning, 1 and 2 GPUs; e.g.
# KNOBS="peft=none backend.gpus_per_node=1,2 backend.data_parallel=ddp,fsdp" compares DDP and FSDP2).
read -r -a knobs <<< "${KNOBS:-peft=lora,none backend.gpus_per_node=1,2}"
command=(python3 -m ghsweep -m model=llama2_7b precision=bf16 "${knobs[@]}"
         train.seq_length=4096 train.micro_batch_size=1 "train.max_steps=$STEPS" profile=nsys
         capture.start_step=$((STEPS - 4)) capture.num_steps=3
         "hydra.sweep.dir=$WORK/sweep" "tracking.uri=sqlite:///$WORK/mlflow.db")
echo "+ ${command[*]}"
"${command[@]}" > "$WORK/sweep.log" 2>&1 || echo "sweep exit $?"
tail -25 "$WORK/sweep.log"
python3 benchmarks/scaling.py "$WORK/sweep" --out "$OUT/h200x2_scaling.json" --command "${command[*]}"
cp "$WORK/sweep/comparison/comparison.md" "$OUT/h200x2_comparison.md" 2>/dev/null || echo "no comparison report"
python3 benchmarks/scaling_profiles.py "$WORK/sweep" --out "$PROFILES"
