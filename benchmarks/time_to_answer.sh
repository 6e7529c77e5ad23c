#!/usr/bin/env bash
# Time to answer: where a sweep's wall time goes, per combination (worker start and imports, set-up,
# first steps, steady steps, the worker's exit, profile analysis, MLflow record, the sweep's own time).
#   OUT=results bash benchmarks/time_to_answer.sh user7b default      # on a GPU machine
#   OUT=results bash benchmarks/time_to_answer.sh cpu_smoke           # the 2x2 CPU smoke sweep
#   OUT=results bash benchmarks/time_to_answer.sh default_unprofiled_fresh default_unprofiled   # the pre-imported worker
#   EXTRA="profile.nsys.trace=[cuda,nvtx]" OUT=results bash benchmarks/time_to_answer.sh default   # a variant
#   REPEATS=2 OUT=results bash benchmarks/time_to_answer.sh default default7b   # cold then warm, twice
#   EXTRA=worker.compile_ahead=false LABEL=plain REPEATS=2 OUT=results bash benchmarks/time_to_answer.sh default   # without compiling ahead
# Each named line runs through the CLI, with the overrides EXTRA holds if any, REPEATS times (default 1)
# as a pair: cold (a fresh sweep directory and an empty train.compile_cache_dir), then warm (a fresh sweep
# directory on the cache the cold run left). $OUT/time_to_answer.json collects the rows of every sweep;
# each sweep's table is printed after it, and the lines' cold/warm table (the spread of the repeats) last.
# LABEL (default: the checkout's commit) names the code measured: run it from an older checkout with the
# same OUT to put before and after side by side (a checkout without train.compile_cache_dir: WARM_ONLY_ENV=1
# leaves the knob out and empties TORCHINDUCTOR_CACHE_DIR's folder instead).
set -u
OUT=${OUT:?set OUT to the folder for the results}
WORK=${WORK:-/tmp/time_to_answer}
LABEL=${LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT" "$WORK"
declare -A LINES=(
  # The user's line on the seed's model: Llama-2-7B shape, seq 4096, micro-batch 1, under nsys.
  [user7b]="precision=bf16,fp8 offload=on,off model=llama2_7b profile=nsys train.seq_length=4096 train.micro_batch_size=1 train.max_steps=12"
  # The headline line on its defaults (tiny model; nsys where it is found).
  [default]="precision=bf16,fp8 offload=on,off"
  # The same at the 7B shape, on the CLI's defaults otherwise.
  [default7b]="precision=bf16,fp8 offload=on,off model=llama2_7b train.seq_length=4096 train.micro_batch_size=1"
  # The headline line without a profiler: what a tuning study's trials run (each worker forked from
  # the pre-imported one on the local launcher, worker.preimported).
  [default_unprofiled]="precision=bf16,fp8 offload=on,off profile=none"
  # The same with every worker started as a fresh interpreter: the baseline of the line above.
  [default_unprofiled_fresh]="precision=bf16,fp8 offload=on,off profile=none worker.preimported=false"
  # The headline line as submitit local jobs, one combination per GPU at once (the GPUs
  # CUDA_VISIBLE_DEVICES lists: CUDA_VISIBLE_DEVICES=0 LABEL=one-gpu ... for the one-GPU baseline).
  [default_local_jobs]="precision=bf16,fp8 offload=on,off hydra/launcher=submitit_local"
  # The 2x2 CPU smoke sweep (benchmarks/cpu_preimported.json; the README's first command sweeps precision alone).
  [cpu_smoke]="experiment=smoke precision=fp32,bf16 offload=off,on"
)
REPEATS=${REPEATS:-1}
for name in "$@"; do
  [[ -n ${LINES[$name]:-} ]] || { echo "unknown line '$name'; accepted: ${!LINES[*]}"; exit 2; }
done
for name in "$@"; do
  for repeat in $(seq "$REPEATS"); do
    cache="$WORK/$LABEL-$name-$repeat-compile-cache"
    rm -rf "$cache"
    for state in cold warm; do
      dir="$WORK/$LABEL-$name-$repeat-$state"
      rm -rf "$dir"
      if [[ -n ${WARM_ONLY_ENV:-} ]]; then
        export TORCHINDUCTOR_CACHE_DIR=$cache
        cache_override=()
      else
        cache_override=("train.compile_cache_dir=$cache")
      fi
      # shellcheck disable=SC2206  # the line's overrides are words on purpose
      command=(python3 -m ghsweep -m ${LINES[$name]} ${EXTRA:-} "${cache_override[@]}" "hydra.sweep.dir=$dir/sweep" "tracking.uri=sqlite:///$dir/mlflow.db")
      echo "+ ${command[*]}"
      start=$(date +%s.%N)
      "${command[@]}" > "$dir.log" 2>&1 || echo "sweep exit $? (log: $dir.log)"
      wall=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$start")
      echo "== $LABEL $name $state #$repeat: ${wall} s"
      python3 "$(dirname "$0")/time_to_answer.py" "$dir/sweep" --wall "$wall" --label "$LABEL $name: ${command[*]}" \
        --line "$LABEL $name" --state "$state" --json "$OUT/time_to_answer.json"
    done
  done
done
python3 "$(dirname "$0")/time_to_answer.py" --lines "$OUT/time_to_answer.json"
