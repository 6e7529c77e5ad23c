#!/usr/bin/env bash
# The seed's data-loader study on one GPU (GTC 2025 talk, "optimisation 1": num_workers 0 vs 4), through the
# CLI with the loader doing a real loader's work (data.prepare=on_the_fly: each block tokenised with the
# subword tokenizer, masked and packed in the loader, in its workers with num_workers > 0).
#   bash benchmarks/seed_studies.sh OUT [dataloader|short|all]      (default: all; ~4-5 min on one H200)
# dataloader: `python -m ghsweep -m experiment=dataloader_workers`, the preset as it is: Llama-2-7B shape
#             (random weights), LoRA bf16, seq 4096, micro-batch 1, under nsys: num_workers 0 vs 4.
# short:      the same study where a step is short against the loader's work: the tiny model, seq 2048,
#             micro-batch 8 (16,384 tokens tokenised and packed per step), under nsys.
# Writes into OUT: dataloader/ and short/ (sweep directories, comparison/comparison.md in each), their logs
# and wall seconds, mlflow.db, and seed_studies.json; prints the table (tokens/s with its 95% interval, GPU
# idle %, the data-loading finding, the comparison's verdict) last.
set -uo pipefail
usage="usage: bash benchmarks/seed_studies.sh OUT [dataloader|short|all]"
cd "$(dirname "$0")/.."
out=${1:?$usage}
part=${2:-all}
[[ $part =~ ^(dataloader|short|all)$ ]] || { echo "unknown part '$part'; $usage"; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The comparison measures num_workers=4 against num_workers=0.
common=(tracking.uri="sqlite:///$out/mlflow.db" 'report.baseline="dataloader.num_workers=0"')

timed() {  # NAME COMMAND...: run it, its output in OUT/NAME.log, its wall seconds in OUT/NAME_wall_s
    local name=$1 started
    shift
    started=$(date +%s.%N)
    "$@" > "$out/$name.log" 2>&1 || echo "$name: exit $? (log: $out/$name.log)"
    python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$started" > "$out/${name}_wall_s"
}

if [[ $part == dataloader || $part == all ]]; then
    timed dataloader python3 -m ghsweep -m experiment=dataloader_workers "${common[@]}" hydra.sweep.dir="$out/dataloader"
fi
if [[ $part == short || $part == all ]]; then
    timed short python3 -m ghsweep -m experiment=dataloader_workers model=tiny_llama train.seq_length=2048 \
        train.micro_batch_size=8 "${common[@]}" hydra.sweep.dir="$out/short"
fi
python3 benchmarks/seed_studies_table.py "$out"
