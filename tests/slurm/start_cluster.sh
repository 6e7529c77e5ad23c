#!/usr/bin/env bash
# Start a two-node SLURM cluster on this machine from Debian's packages, for tests and CI:
# munged (its own socket), mariadbd (local socket only), slurmdbd (so sacct works), slurmctld and two slurmd.
#
#   sudo apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server
#   sudo tests/slurm/start_cluster.sh [STATE_DIR [PORT_BASE]]   # stop: tests/slurm/stop_cluster.sh [STATE_DIR]
#
# PORT_BASE (default 6817, SLURM's own ports): slurmctld listens on it, node1's slurmd on +1, slurmdbd
# on +2, node2's slurmd on +3. The config files go where $SLURM_CONF points (default
# /etc/slurm/slurm.conf; slurmdbd.conf and gres.conf beside it), so with its own SLURM_CONF, state
# directory and ports a cluster leaves others on the host alone (the tests start one per session).
# Commands for it need the same SLURM_CONF; STATE_DIR/slurm_conf records it.
#
# Two nodes, node1 and node2, are two slurmd on this host (each its own NodeName, spool and Port;
# Debian's slurmd runs several per host as long as each has its own NodeHostname), so that a job can
# span two nodes (srun across them). Node names need not resolve: NodeAddr is 127.0.0.1, and jobs
# that rendezvous across nodes take 127.0.0.1 from GHSWEEP_MASTER_ADDR (launchers/local_slurm.yaml).
# Each node advertises 8 CPUs and 8 fake GPUs (gres files are links to /dev/null) so that
# `gpus_per_node=1` can be requested and 8 one-CPU jobs run at once; they time-share the real cores.
# Every daemon uses sockets and pid files under STATE_DIR, so services a package may have started
# are left alone. The pid files are what stop_cluster.sh stops, never a process name.
set -euo pipefail

STATE=${1:-/var/tmp/ghsweep-slurm}
PORT_BASE=${2:-6817}
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
CONF_DIR=$(dirname "$SLURM_CONF")
CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 2))
MARKER="# written by ghsweep tests/slurm/start_cluster.sh"
NODE_CPUS=8
NODE_GPUS=8
NODES="node1 node2"
# slurmd ports: node1 PORT_BASE+1 (6818, SLURM's default), node2 PORT_BASE+3 (PORT_BASE+2 is slurmdbd's).
node_port() { [ "$1" = node1 ] && echo $((PORT_BASE + 1)) || echo $((PORT_BASE + 3)); }

die() { echo "start_cluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it writes $CONF_DIR and starts daemons)"
for bin in munged mungekey munge unmunge mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sinfo sacct; do
    command -v "$bin" >/dev/null || die "$bin not found; install: apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
done
for f in slurm.conf slurmdbd.conf gres.conf; do
    if [ -e "$CONF_DIR/$f" ] && ! grep -qF "$MARKER" "$CONF_DIR/$f"; then
        die "$CONF_DIR/$f exists and was not written by this script; refusing to overwrite it"
    fi
done

mkdir -p "$STATE"/{run,log,spool/ctld,spool/d/node1,spool/d/node2,dev,munge,mysql} "$CONF_DIR"
STATE=$(cd "$STATE" && pwd)
echo "$SLURM_CONF" >"$STATE/slurm_conf"
RUN=$STATE/run
waitfor() {  # waitfor SECONDS WHAT COMMAND...: retry COMMAND until it succeeds
    local deadline=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "$what did not come up; logs in $STATE/log"
        sleep 0.2
    done
}
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# munge with its own key and socket: slurm.conf's AuthInfo points this cluster's daemons and client
# commands at it. A munged at the default socket would be shared by every cluster on the host, and
# stopping one cluster would cut the others' authentication.
MUNGE_SOCKET=$STATE/munge/munge.socket
chown munge:munge "$STATE/munge"
[ -s "$STATE/munge/munge.key" ] || runuser -u munge -- mungekey --create --keyfile="$STATE/munge/munge.key"
if ! munge -n --socket="$MUNGE_SOCKET" 2>/dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1; then
    runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/munged.seed"
fi
waitfor 10 munged bash -c "munge -n --socket='$MUNGE_SOCKET' | unmunge --socket='$MUNGE_SOCKET'"

# mariadb on a unix socket only; slurmdbd (running as root) logs in as root through that socket.
DB_SOCKET=$RUN/mysqld.sock
if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
        --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $STATE/log/mariadb-install.log"
fi
if ! running "$RUN/mariadbd.pid"; then
    setsid mariadbd --user=root --datadir="$STATE/mysql" --socket="$DB_SOCKET" --skip-networking \
        --pid-file="$RUN/mariadbd.pid" --log-error="$STATE/log/mariadbd.log" </dev/null >/dev/null 2>&1 &
fi
waitfor 60 mariadbd mariadb --socket="$DB_SOCKET" -e "select 1"

# Fake GPUs: gres needs one device file per GPU; links to /dev/null are accepted (regular files are not).
for i in $(seq 0 $((2 * NODE_GPUS - 1))); do ln -sfn /dev/null "$STATE/dev/nvidia$i"; done

MEM_MB=$(( $(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') - 512 ))

cat >"$CONF_DIR/slurmdbd.conf" <<CONF
$MARKER
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=$RUN/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
CONF
chmod 600 "$CONF_DIR/slurmdbd.conf"

cat >"$CONF_DIR/slurm.conf" <<CONF
$MARKER
ClusterName=ghsweep
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
# cred_expire (default 120 s, at least 5) is also how long SLURM holds a requeued job before it may
# start again: the node-down requeue test waits it out. A launch must reach its slurmd within it, which
# here takes well under a second; 20 s leaves a loaded machine room.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=20
StateSaveLocation=$STATE/spool/ctld
# %n: the node's name; every slurmd of this host has its own spool, pid file and log.
SlurmdSpoolDir=$STATE/spool/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.%n.log
# No cgroups on a plain machine or in a container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
# Without batch_sched_delay=0, a job waits ~2 s in the queue before it starts; a job whose begin time
# passes (a requeued job, held for cred_expire) waits for the main scheduler's pass, every 60 s by default.
SchedulerParameters=batch_sched_delay=0,sched_interval=2
ReturnToService=2
# The node advertises more CPUs than it has (see the top of this script).
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# For slurmdbd connections SLURM takes the munge socket from here, not from AuthInfo (slurm.conf(5)).
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
KillWait=5
$(for node in $NODES; do
    echo "NodeName=$node NodeAddr=127.0.0.1 Port=$(node_port $node) CPUs=$NODE_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=$MEM_MB Gres=gpu:$NODE_GPUS State=UNKNOWN"
done)
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF

cat >"$CONF_DIR/gres.conf" <<CONF
$MARKER
NodeName=node1 Name=gpu File=$STATE/dev/nvidia[0-$((NODE_GPUS - 1))]
NodeName=node2 Name=gpu File=$STATE/dev/nvidia[$NODE_GPUS-$((2 * NODE_GPUS - 1))]
CONF

# slurmdbd finds mariadb's socket through the client library's MYSQL_UNIX_PORT.
running "$RUN/slurmdbd.pid" || MYSQL_UNIX_PORT=$DB_SOCKET slurmdbd
waitfor 60 slurmdbd sacctmgr -i list cluster
running "$RUN/slurmctld.pid" || slurmctld
waitfor 60 slurmctld scontrol ping
for node in $NODES; do
    running "$RUN/slurmd.$node.pid" || slurmd -N "$node"
done
waitfor 60 "the nodes node1 and node2" bash -c "[ \$(sinfo -h -N -o %t | grep -cE '^(idle|mix|alloc)') = 2 ]"
# A node left DOWN/INVAL by an earlier run comes back with resume (harmless when it is idle).
echo "SLURM cluster up: $(sinfo -h -N -o '%N %t CPUs=%c gres=%G') (state in $STATE)"
