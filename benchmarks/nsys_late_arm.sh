#!/usr/bin/env bash
# Two facts a sweep that overlaps one combination's nsys report with the next combination's start
# rests on, measured with the real nsys on one GPU (benchmarks/nsys_late_arm.py says what each child does):
#   1. a collection armed with `nsys start` after its worker was forked records that worker;
#   2. a worker may exit while nsys writes its report, once its stop has begun, and the report is whole.
#   3. (early:MODE) whether a worker forked while nsys writes the report before it delays that report.
#   4. (sub:MODE, thread:MODE) whether a process a worker leaves behind, or a thread in timed waits as
#      it exits, delays its report.
#   OUT=results bash benchmarks/nsys_late_arm.sh            (~3 min; MODES=join,exit0.5,... to choose)
#   TWO_SESSIONS=1 ...: children alternate between two servers, each in a session of its own
#   TRACE=cuda,nvtx ...: the servers' trace set (default: the seed's, cuda,nvtx,osrt,cudnn,cublas)
# Prints, per child: the session's states from the child's stop on (as `nsys sessions list` shows them), how long cudaProfilerStop held it (join) or when it exited, how long after its exit
# the session was back in state Launched (ready for the next collection), and what its report holds
# (kernels: 30 x the child's number when whole).
set -u
OUT=${OUT:?set OUT to the folder for the results}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
signals=$(mktemp -d)
modes=${MODES:-join,exit0.5,exit0.2,exit0.5,exit0.2,exit,join}
sessions=(ghsweep-late-arm-$$)
[ -n "${TWO_SESSIONS:-}" ] && sessions+=(ghsweep-late-arm-b-$$)
echo 0 > "$signals/exited_0"
for k in "${!sessions[@]}"; do
  # Server k forks the children n with n % (number of sessions) == k, in session k.
  own=$(python3 -c "import sys; m = sys.argv[1].split(','); print(','.join(x if (i + 1) % int(sys.argv[2]) == int(sys.argv[3]) else '-' for i, x in enumerate(m)))" "$modes" ${#sessions[@]} "$k")
  nsys launch --session-new=${sessions[$k]} --trace=${TRACE:-cuda,nvtx,osrt,cudnn,cublas} --trace-fork-before-exec=true \
    python3 benchmarks/nsys_late_arm.py "$signals" "$own" > "$OUT/late_arm_server_$k.txt" 2>&1 &
done
now() { python3 -c "import time; print(time.time())"; }
state() { nsys sessions list | awk -v s=$session '$5 == s {print $3}'; }
n=0
for mode in ${modes//,/ }; do
  n=$((n + 1))
  session=${sessions[$(( n % ${#sessions[@]} ))]}
  touch "$signals/go_$n"
  for _ in $(seq 450); do [ -f "$signals/ready_$n" ] && break; sleep 0.1; done
  [ -f "$signals/ready_$n" ] || { echo "child $n never got ready:"; cat "$OUT"/late_arm_server_*.txt; kill %1; exit 1; }
  nsys start --session=$session --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true \
    --output="$OUT/late_arm_$n" --sample=none --cpuctxsw=none > /dev/null 2>&1
  touch "$signals/armed_$n"
  while [ ! -f "$signals/polled_$n" ]; do echo "$(now) $(state)"; done > "$signals/states_$n" &
  poller=$!
  for _ in $(seq 600); do [ -f "$signals/done_$n" ] && break; sleep 0.05; done
  exited=$(cat "$signals/exited_$n")
  for _ in $(seq 900); do [ "$(state)" = Launched ] && break; sleep 0.1; done
  echo "child $n ($mode): session Launched $(python3 -c "print(round($(now) - $exited, 2))") s after the child exited"
  touch "$signals/polled_$n"
  wait $poller
  python3 - "$signals/states_$n" "$(cat "$signals/began_$n")" <<'PY'
import sys
began, seen = float(sys.argv[2]), []
for line in open(sys.argv[1]):
    t, *state = line.split()
    if state and (not seen or seen[-1][1] != state[0]):
        seen.append((float(t) - began, state[0]))
print("  states from its stop on:", ", ".join(f"{s} at {t:+.2f} s" for t, s in seen))
PY
  nsys stop --session=$session > /dev/null 2>&1
done
wait
cat "$OUT"/late_arm_server_*.txt | grep '^child' | sort -k2n
n=0
for mode in ${modes//,/ }; do
  n=$((n + 1))
  nsys export --type=sqlite --force-overwrite=true -o "$OUT/late_arm_$n.sqlite" "$OUT/late_arm_$n.nsys-rep" > /dev/null 2>&1
  python3 - "$OUT/late_arm_$n.sqlite" "$n" "$mode" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
count = lambda t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] if t in tables else None
steps = sorted(r[0] for r in con.execute("SELECT DISTINCT text FROM NVTX_EVENTS WHERE text LIKE 'step_%'")) if "NVTX_EVENTS" in tables else []
print(f"report {sys.argv[2]} ({sys.argv[3]}): kernels {count('CUPTI_ACTIVITY_KIND_KERNEL')}, steps {steps}, OS runtime calls {count('OSRT_API')}")
PY
done
