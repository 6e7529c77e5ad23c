#!/usr/bin/env bash
# tune.prune on one GPU: the same two-trial study (Llama-2-7B shape, LoRA bf16, seq 4096, micro-batch 1,
# offload off then on, no profiler) with pruning on and then off, each a fresh study, timed.
#   bash benchmarks/prune.sh OUT      (~5 min on one H100/H200)
# The pruned study runs first, so it alone pays a cold compile cache: the comparison leans against it.
# Writes OUT/prune_{true,false}/ (sweep, MLflow store, journal), their logs, and OUT/prune.json (the
# rows of benchmarks/time_to_answer.py per study); prints each study's trial table and where each
# trial's time went, the steady steps and the study's wall last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/prune.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/prune.json"
# tune.seed=2: the first trial is offload=off (the faster), so the second has a bar to fall below.
line=(-m hydra/sweeper=tune model=llama2_7b train.seq_length=4096 train.micro_batch_size=1 profile=none
      precision=bf16 offload=off,on tune.trials=2 tune.seed=2)
for prune in true false; do
    dir="$out/prune_$prune"
    rm -rf "$dir"
    started=$(date +%s.%N)
    python3 -m ghsweep "${line[@]}" tune.prune=$prune hydra.sweep.dir="$dir/sweep" \
        tracking.uri="sqlite:///$dir/mlflow.db" tune.storage="$dir/tune.journal" > "$dir.log" 2>&1 \
        || echo "study exit $? (log: $dir.log)"
    wall=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$started")
    echo "== tune.prune=$prune: ${wall} s"
    sed -n '/^trial  /,/^$/p' "$dir.log"
    python3 benchmarks/time_to_answer.py "$dir/sweep" --wall "$wall" --label "tune.prune=$prune" --json "$out/prune.json"
done
