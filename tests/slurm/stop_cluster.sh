#!/usr/bin/env bash
# Stop the cluster tests/slurm/start_cluster.sh started: cancel its jobs, then stop each daemon by
# the pid it recorded (never by name), in the reverse order of start.
#
#   sudo tests/slurm/stop_cluster.sh [STATE_DIR]
set -uo pipefail

STATE=${1:-/var/tmp/ghsweep-slurm}
[ -d "$STATE" ] || { echo "stop_cluster.sh: no cluster state in $STATE" >&2; exit 1; }
# The cluster's config, as start_cluster.sh recorded it: squeue and scancel must ask this cluster.
[ -s "$STATE/slurm_conf" ] && export SLURM_CONF=$(cat "$STATE/slurm_conf")

if [ -s "$STATE/run/slurmctld.pid" ]; then
    jobs=$(squeue -h -o %A 2>/dev/null)
    [ -z "$jobs" ] || scancel $jobs
fi

stop() {  # stop PIDFILE NAME
    local pidfile=$1 name=$2 pid
    [ -s "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "stop_cluster.sh: $name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
            kill -KILL "$pid"
        fi
    fi
    rm -f "$pidfile"
}
for pidfile in "$STATE"/run/slurmd*.pid; do stop "$pidfile" "slurmd ($(basename "$pidfile"))"; done
stop "$STATE/run/slurmctld.pid" slurmctld
stop "$STATE/run/slurmdbd.pid" slurmdbd
stop "$STATE/run/mariadbd.pid" mariadbd
stop "$STATE/munge/munged.pid" munged
echo "SLURM cluster in $STATE stopped"
