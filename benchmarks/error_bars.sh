#!/usr/bin/env bash
# Error bars on one GPU: Llama-2-7B shape (random weights), LoRA bf16, seq 4096, micro-batch 1.
#   bash benchmarks/error_bars.sh OUT [agree|sweep|today|all]   (default: all; each part fits in ~9 min
#   on one H100/H200, all three ~20 min)
# agree: `python -m ghsweep.bench --rows ours_lora_bf16`, then the same combination through the CLI three
#        times, each its own process (no profiler): do the bench's and the CLI's intervals overlap, and
#        how far apart are the three repeats?
# sweep: the line `python -m ghsweep -m precision=bf16,fp8 offload=on,off model=llama2_7b profile=nsys
#        train.seq_length=4096 train.micro_batch_size=1 train.max_steps=12` as it runs now (measuring on
#        until each interval is within train.measure_ci_pct), with its wall time.
# today: the same sweep at a fixed length (train.measure=false): the wall time the sweep had before.
# repeats: `python -m ghsweep -m repeat=1,2,3 precision=fp8 ...` (no profiler), each run measured to
#        REPEATS_CI_PCT (default 0.25) of its median: how far apart three processes land when each is
#        measured that closely (at the default 1% the repeats differ by up to about 1%).
# Writes into OUT: bench.json, cli_1..3/ (run directories), sweep/, sweep_today/ and repeats/ (sweep directories,
# comparison.md in each), *_wall_s, *.log, and error_bars.json; prints the table of everything in OUT last.
set -uo pipefail
usage="usage: bash benchmarks/error_bars.sh OUT [agree|sweep|today|repeats|all]"
cd "$(dirname "$0")/.."
out=${1:?$usage}
part=${2:-all}
[[ $part =~ ^(agree|sweep|today|repeats|all)$ ]] || { echo "unknown part '$part'; $usage"; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
shape=(model=llama2_7b train.seq_length=4096 train.micro_batch_size=1 tracking.uri="sqlite:///$out/mlflow.db")
# The baseline bf16 offload=off: the comparison then says how bf16 offload=on differs from it.
sweep_line=(-m precision=bf16,fp8 offload=on,off profile=nsys train.max_steps=12 "${shape[@]}"
            'report.baseline="precision=bf16 offload=off"')

timed() {  # NAME COMMAND...: run it, its output in OUT/NAME.log, its wall seconds in OUT/NAME_wall_s
    local name=$1 started
    shift
    started=$(date +%s.%N)
    "$@" > "$out/$name.log" 2>&1
    python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$started" > "$out/${name}_wall_s"
}

if [[ $part == agree || $part == all ]]; then
    timed bench python3 -m ghsweep.bench --rows ours_lora_bf16 --out "$out/bench.json" --logs "$out/bench_logs"
    for r in 1 2 3; do
        timed "cli_$r" python3 -m ghsweep precision=bf16 offload=off profile=none "${shape[@]}" \
            hydra.run.dir="$out/cli_$r"
    done
fi
if [[ $part == sweep || $part == all ]]; then
    timed sweep python3 -m ghsweep "${sweep_line[@]}" hydra.sweep.dir="$out/sweep"
fi
if [[ $part == today || $part == all ]]; then
    timed sweep_today python3 -m ghsweep "${sweep_line[@]}" train.measure=false hydra.sweep.dir="$out/sweep_today"
fi
if [[ $part == repeats || $part == all ]]; then
    timed repeats python3 -m ghsweep -m repeat=1,2,3 precision=fp8 offload=off profile=none "${shape[@]}" \
        train.measure_ci_pct="${REPEATS_CI_PCT:-0.25}" train.measure_max_steps=800 train.measure_max_s=75 \
        hydra.sweep.dir="$out/repeats"
fi
python3 benchmarks/error_bars_table.py "$out"
