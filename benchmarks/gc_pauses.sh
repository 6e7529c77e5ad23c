#!/usr/bin/env bash
# Does Python's garbage collector make a combination's step times spread (and so its measurement
# longer)? The 7B shape's fp8 with offload, Python's own collections against train.gc_interval=50,
# twice each, in one sweep on one GPU; the table last (benchmarks/gc_pauses.py).
#   bash benchmarks/gc_pauses.sh OUT [more overrides]
set -euo pipefail
OUT=${1:?the folder for the results}
shift
mkdir -p "$OUT"
python3 -m ghsweep -m precision=fp8 offload=on model=llama2_7b train.seq_length=4096 train.micro_batch_size=1 \
  profile=none 'train.gc_interval=null,50' repeat=1,2 "$@" \
  hydra.sweep.dir="$OUT/sweep" tracking.uri="sqlite:///$OUT/mlflow.db" > "$OUT/sweep.log" 2>&1 || echo "sweep exit $? (log: $OUT/sweep.log)"
python3 "$(dirname "$0")/gc_pauses.py" "$OUT/sweep" --json "$OUT/gc_pauses.json"
