#!/usr/bin/env bash
# experiment=autotune on one GPU, timed: the study's answer, plots and log into $OUT (default autotune-out/).
#   OUT=results bash benchmarks/autotune.sh [more overrides, e.g. tune.trials=12]
# The sweep, its MLflow store and the study's journal go to $WORK (default: a fresh temporary folder,
# so a new study). The study stops after $LIMIT_S seconds (default 540) as if interrupted; the same
# command with the same WORK continues it. The last lines are the study's trial table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-autotune-out}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
start=$(date +%s)
timeout -s INT "${LIMIT_S:-540}" python3 -m ghsweep -m experiment=autotune hydra.sweep.dir="$work/sweep-$start" \
  tracking.uri="sqlite:///$work/mlflow.db" tune.storage="$work/tune.journal" "$@" > "$out/autotune.log" 2>&1
status=$?
wall_s=$(( $(date +%s) - start ))
tune="$work/sweep-$start/tune"
cp "$tune/tune.md" "$tune/best.txt" "$tune"/history_*.png "$tune"/importance_*.png "$work/sweep-$start/summary.md" "$out/" 2>/dev/null
python3 - "$work/tune.journal" "$wall_s" "$status" > "$out/autotune.json" <<'PY'
import json, sys
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
journal, wall_s, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
storage = JournalStorage(JournalFileBackend(journal))
(name,) = optuna.get_all_study_names(storage)
study = optuna.load_study(study_name=name, storage=storage)
done = [t for t in study.trials if t.state.is_finished()]
try:
    best = study.best_trial
except ValueError:
    best = None
print(json.dumps({
    "exit_status": status, "wall_s": wall_s, "trials": len(done),
    "finished": sum(t.state == optuna.trial.TrialState.COMPLETE for t in done),
    "best_tokens_per_s": best.value if best else None, "best_params": best.params if best else None,
    "best_command": " ".join(["python -m ghsweep", *best.user_attrs["overrides"]]) if best else None,
    "trials_detail": [{"number": t.number, "state": t.state.name, "params": t.params, "value": t.value,
                       "constraints": t.constraints, "error": t.user_attrs.get("error")} for t in done],
}, indent=1))
PY
if [ -f "$tune/tune.md" ]; then sed -n '/^```$/,/^```$/p' "$tune/tune.md" | sed '1d;$d'; else tail -30 "$out/autotune.log"; fi
echo "wall time: ${wall_s} s; exit status ${status}; files in $out: $(ls "$out" | tr '\n' ' ')"
