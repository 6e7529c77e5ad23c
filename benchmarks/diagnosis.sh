#!/usr/bin/env bash
# What the analysis says about why, on a machine with two GPUs, through the CLI on its defaults:
#   OUT=results bash benchmarks/diagnosis.sh
# 1. the user's 7B LoRA line twice in one sweep (repeat=1,2 x precision=bf16,fp8; Llama-2-7B shape,
#    seq 4096, micro-batch 1, nsys on with its default trace set; TRACE=... sets another for 1 and 2);
# 2. the same shape's full fine-tuning on one and on two GPUs (peft=none backend.gpus_per_node=1,2);
# 3. (TRACE_SETS=1, the default) fp8 under three nsys trace sets in one sweep: [cuda,nvtx], the
#    default [cuda,nvtx,osrt] and the former default [cuda,nvtx,osrt,cudnn,cublas]: the profiler's
#    overhead each costs, for the default to be chosen on it.
# Then benchmarks/diagnosis.py prints the profiler's overhead per run, the findings of each repeat,
# `python -m ghsweep.analyze RUN --against BASELINE` for fp8 against bf16 and 2 GPUs against 1 with
# the sum of the parts against the step difference, and the scale-out finding; it writes
# $OUT/diagnosis.json and the compared runs' exports, trimmed and gzipped, under $OUT/exports/, and
# each sweep's comparison report as $OUT/diagnosis_<sweep>.md. WORK (default /tmp/diagnosis) keeps the
# sweeps and their MLflow store. STEPS (default 12) is train.max_steps; train.measure stops within
# its step budget (MEASURE_STEPS, default 40) so the whole fits in about 8 minutes on two H200s.
set -u -f  # -f: the trace sets' brackets are words, not file patterns
OUT=${OUT:?set OUT to the folder for the results}
WORK=${WORK:-/tmp/diagnosis}
STEPS=${STEPS:-12}
MEASURE_STEPS=${MEASURE_STEPS:-40}
TRACE_SETS=${TRACE_SETS:-1}
mkdir -p "$OUT" "$WORK"
# NVLink SHARP (multicast) stays off: not every machine allows it.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
shape=(model=llama2_7b train.seq_length=4096 train.micro_batch_size=1 "train.max_steps=$STEPS"
       "train.measure_max_steps=$MEASURE_STEPS" profile=nsys "tracking.uri=sqlite:///$WORK/mlflow.db")
trace=${TRACE:+profile.nsys.trace=$TRACE}
declare -A SWEEPS=(
  [repeats]="repeat=1,2 precision=bf16,fp8 $trace"
  [scaling]="peft=none backend.gpus_per_node=1,2 $trace"
  [trace_sets]="precision=fp8 profile.nsys.trace=[cuda,nvtx],[cuda,nvtx,osrt],[cuda,nvtx,osrt,cudnn,cublas]"
)
order=(repeats scaling)
[[ $TRACE_SETS == 1 ]] && order+=(trace_sets)
dirs=()
for name in "${order[@]}"; do
  rm -rf "$WORK/$name"
  # shellcheck disable=SC2206  # the sweep's overrides are words on purpose
  command=(python3 -m ghsweep -m ${SWEEPS[$name]} "${shape[@]}" "hydra.sweep.dir=$WORK/$name")
  echo "+ ${command[*]}"
  start=$(date +%s)
  "${command[@]}" > "$WORK/$name.log" 2>&1 || echo "sweep exit $? (log: $WORK/$name.log)"
  echo "== $name: $(( $(date +%s) - start )) s"
  grep -A40 "^ghsweep comparison:" "$WORK/$name.log" | head -60
  cp "$WORK/$name/comparison/comparison.md" "$OUT/diagnosis_$name.md" 2>/dev/null || echo "no comparison report"
  dirs+=("$WORK/$name")
done
python3 "$(dirname "$0")/diagnosis.py" "${dirs[@]}" --out "$OUT/diagnosis.json" --exports "$OUT/exports"
