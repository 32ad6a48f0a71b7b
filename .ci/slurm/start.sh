#!/usr/bin/env bash
# Start a single-node SLURM cluster with accounting on localhost (as root), then wait until
# the node is idle. Idempotent: daemons already running from the same state dir are kept.
# Env: SLURM_STATE_DIR (default /tmp/distinctcap-slurm), SLURM_FAKE_GPUS (default 2),
#      SLURM_{CTLD,SLURMD,DBD,DB}_PORT, SLURM_START_TIMEOUT (seconds, default 60),
#      SLURM_CGROUPS (auto: enforce --mem with cgroups where the machine allows it; no: never).
# Clients need SLURM_CONF=$SLURM_STATE_DIR/etc/slurm.conf unless /etc/slurm/slurm.conf is the
# symlink this script makes (it never replaces a real file there).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
report_failures start
TIMEOUT="${SLURM_START_TIMEOUT:-60}"
t0=$SECONDS

fail() {
    echo "slurm start: FAILED: $*" >&2
    log_tails >&2
    exit 1
}

# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.5 s until it succeeds.
wait_for() {
    local limit="$1" what="$2"
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || fail "$what not ready after ${limit}s"
        sleep 0.5
    done
}

[ "$(id -u)" = 0 ] || fail "must run as root"
for bin in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sacctmgr sinfo; do
    command -v "$bin" >/dev/null || fail "$bin missing; run .ci/slurm/install.sh first"
done

mkdir -p "$STATE"/{etc,run,log,munge,mysql,mysql-run,slurmctld,slurmd,dev}
chmod 755 "$STATE"
touch "$STATE/$STATE_MARK"
# munged and mariadbd run as their own users: each must reach its dir through every parent.
for user in munge mysql; do
    runuser -u "$user" -- test -x "$STATE" ||
        fail "user $user cannot traverse to $STATE; use a state dir whose parents are world-executable"
done
chown munge:munge "$STATE/munge"
chmod 755 "$STATE/munge"
chown mysql:mysql "$STATE/mysql" "$STATE/mysql-run"
touch "$STATE/log/munged.log" "$STATE/log/mariadbd.log"
chown munge:munge "$STATE/log/munged.log"
chown mysql:mysql "$STATE/log/mariadbd.log"

# ---- render configs ------------------------------------------------------------------------
node="$(hostname -s)"
hw="$(slurmd -C | head -n 1)"
cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$hw")"
real_mem="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")"
{ [ -n "$cpus" ] && [ -n "$real_mem" ]; } || fail "cannot parse 'slurmd -C': $hw"
def_mem=$((real_mem / cpus))
[ "$def_mem" -le 1024 ] || def_mem=1024
[ -s "$STATE/etc/dbpass" ] || (umask 077 && od -An -tx1 -N12 /dev/urandom | tr -d ' \n' >"$STATE/etc/dbpass")
db_pass="$(cat "$STATE/etc/dbpass")"

[[ "$NGPUS" =~ ^[1-9][0-9]*$ ]] || fail "SLURM_FAKE_GPUS must be a positive integer, got '$NGPUS'"
# cgroup_memory_problem: why SLURM cannot enforce --mem with cgroup v1 here (empty if it can):
# task/cgroup needs a writable memory controller at /sys/fs/cgroup/memory.
cgroup_memory_problem() {
    local probe=/sys/fs/cgroup/memory/distinctcap-probe.$$ err
    [ -d /sys/fs/cgroup/memory ] || { echo "no cgroup v1 memory controller at /sys/fs/cgroup/memory"; return; }
    if ! err="$(mkdir "$probe" 2>&1 && echo 67108864 2>&1 >"$probe/memory.limit_in_bytes")"; then
        echo "cannot create a memory cgroup: $err"
    fi
    rmdir "$probe" 2>/dev/null || true
}
cgroup_problem="$(cgroup_memory_problem)"
if [ "${SLURM_CGROUPS:-auto}" = no ]; then cgroup_problem="disabled by SLURM_CGROUPS=no"; fi
if [ -z "$cgroup_problem" ]; then
    proctrack=proctrack/cgroup task_plugin=task/cgroup memory_note="enforced (cgroup v1)"
else
    proctrack=proctrack/linuxproc task_plugin=task/none memory_note="NOT enforced: $cgroup_problem"
    echo "slurm start: WARNING memory limits not enforced: $cgroup_problem" >&2
fi

# A new state dir has no configs yet: hash whatever exists (cat fails on the missing ones).
old_sum="$({ cat "$STATE"/etc/{slurm,gres,slurmdbd,cgroup}.conf 2>/dev/null || true; } | md5sum)"
render() {
    sed -e "s|@STATE@|$STATE|g" -e "s|@NODE@|$node|g" -e "s|@CPUS@|$cpus|g" \
        -e "s|@PROCTRACK@|$proctrack|g" -e "s|@TASK_PLUGIN@|$task_plugin|g" \
        -e "s|@REAL_MEMORY@|$real_mem|g" -e "s|@DEF_MEM_PER_CPU@|$def_mem|g" \
        -e "s|@NGPUS@|$NGPUS|g" -e "s|@GPU_TYPE@|$GPU_TYPE|g" -e "s|@LAST_GPU@|$((NGPUS - 1))|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_PASS@|$db_pass|g" \
        "$HERE/$1" >"$STATE/etc/$1"
}
render slurm.conf
render gres.conf
render slurmdbd.conf
render cgroup.conf
chmod 600 "$STATE/etc/slurmdbd.conf"
if [ "$old_sum" != "$(cat "$STATE"/etc/{slurm,gres,slurmdbd,cgroup}.conf | md5sum)" ] &&
    pid_alive "$STATE/run/slurmctld.pid" slurmctld >/dev/null; then
    echo "slurm start: config changed under running daemons; run stop.sh then start.sh" >&2
fi
cat >"$STATE/etc/my.cnf" <<CNF
[mysqld]
datadir=$STATE/mysql
socket=$STATE/mysql-run/mysqld.sock
pid-file=$STATE/mysql-run/mariadbd.pid
log-error=$STATE/log/mariadbd.log
bind-address=127.0.0.1
port=$DB_PORT
skip-name-resolve
innodb_buffer_pool_size=128M
innodb_lock_wait_timeout=900
[client]
socket=$STATE/mysql-run/mysqld.sock
CNF
echo "export SLURM_CONF=$SLURM_CONF" >"$STATE/env.sh"

# Fake GPUs: gres/gpu needs character devices behind File=.
for ((i = 0; i < NGPUS; i++)); do
    [ -c "$STATE/dev/gpu$i" ] || mknod -m 666 "$STATE/dev/gpu$i" c 1 3 || fail "mknod failed"
done

# Let client commands find the config without SLURM_CONF. Needed by snakemake: its slurm-jobstep
# executor drops every SLURM_* variable (SLURM_CONF too) before the srun inside each job.
mkdir -p /etc/slurm
if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
    ln -sfn "$SLURM_CONF" /etc/slurm/slurm.conf
else
    echo "slurm start: WARNING /etc/slurm/slurm.conf is a real file and was left alone;" \
        "clients need SLURM_CONF=$SLURM_CONF and snakemake's srun inside jobs will not" \
        "find this cluster" >&2
fi

# ---- daemons ---------------------------------------------------------------------------------
running() { pid_alive "$1" "$2" >/dev/null; }

if ! running "$STATE/munge/munged.pid" munged; then
    if [ ! -s "$STATE/munge/munge.key" ]; then
        (umask 077 && dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none)
    fi
    chown munge:munge "$STATE/munge/munge.key"
    chmod 400 "$STATE/munge/munge.key"
    rm -f "$STATE/munge/munge.socket.2" "$STATE/munge/munge.socket.2.lock"  # stale after a crash
    runuser -u munge -- munged --key-file="$STATE/munge/munge.key" \
        --socket="$STATE/munge/munge.socket.2" --pid-file="$STATE/munge/munged.pid" \
        --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed" \
        </dev/null >>"$STATE/log/munged.log" 2>&1 || fail "munged did not start"
fi
wait_for 10 munged munge -n --socket="$STATE/munge/munge.socket.2"

if ! running "$STATE/mysql-run/mariadbd.pid" mariadbd; then
    if [ ! -d "$STATE/mysql/mysql" ]; then
        mariadb-install-db --defaults-file="$STATE/etc/my.cnf" --user=mysql \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$STATE/log/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed"
    fi
    setsid mariadbd --defaults-file="$STATE/etc/my.cnf" --user=mysql \
        </dev/null >>"$STATE/log/mariadbd.log" 2>&1 &
fi
wait_for 30 mariadbd mariadb-admin --defaults-file="$STATE/etc/my.cnf" ping
mariadb --defaults-file="$STATE/etc/my.cnf" -e "
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || fail "cannot create the slurm db user"

if ! running "$STATE/run/slurmdbd.pid" slurmdbd; then
    slurmdbd </dev/null >>"$STATE/log/slurmdbd.out" 2>&1 || fail "slurmdbd did not start"
fi
wait_for 30 slurmdbd sacctmgr -n show cluster
if [ -z "$(sacctmgr -n -P show cluster distinctcap format=cluster)" ]; then
    sacctmgr -i add cluster distinctcap >/dev/null || fail "sacctmgr add cluster failed"
fi
if [ -z "$(sacctmgr -n -P show account distinctcap format=account)" ]; then
    sacctmgr -i add account distinctcap cluster=distinctcap description=ci organization=ci \
        >/dev/null || fail "sacctmgr add account failed"
    sacctmgr -i add user root account=distinctcap cluster=distinctcap >/dev/null ||
        fail "sacctmgr add user failed"
fi

if ! running "$STATE/run/slurmctld.pid" slurmctld; then
    slurmctld </dev/null >>"$STATE/log/slurmctld.out" 2>&1 || fail "slurmctld did not start"
fi
wait_for 30 slurmctld scontrol ping

if ! running "$STATE/run/slurmd.pid" slurmd; then
    slurmd </dev/null >>"$STATE/log/slurmd.out" 2>&1 || fail "slurmd did not start"
fi

# ---- wait for the node ----------------------------------------------------------------------
end=$((SECONDS + TIMEOUT))
while :; do
    state="$(sinfo -h -n "$node" -o %T 2>/dev/null | head -n 1 || true)"
    case "$state" in
        idle | mixed | allocated | completing) break ;;
        down* | drain*)
            scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
    esac
    [ "$SECONDS" -lt "$end" ] || fail "node $node is '${state:-unknown}' after ${TIMEOUT}s"
    sleep 0.5
done
echo "slurm start: node $node $state (CPUs=$cpus RealMemory=$real_mem gpu:$GPU_TYPE:$NGPUS)" \
    "in $((SECONDS - t0))s; memory $memory_note; state in $STATE; SLURM_CONF=$SLURM_CONF"
