# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings for start.sh/stop.sh (sourced, not executed).
# Every path the cluster writes lives under one state dir, so start/stop are idempotent.
STATE="${SLURM_STATE_DIR:-/tmp/distinctcap-slurm}"
CTLD_PORT="${SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${SLURM_SLURMD_PORT:-6818}"
DBD_PORT="${SLURM_DBD_PORT:-6819}"
DB_PORT="${SLURM_DB_PORT:-3307}"
NGPUS="${SLURM_FAKE_GPUS:-2}"
GPU_TYPE="${SLURM_FAKE_GPU_TYPE:-fakegpu}"
export SLURM_CONF="$STATE/etc/slurm.conf"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# A file that marks a directory as this cluster's state, so stop.sh removes only such a dir.
STATE_MARK=.distinctcap-slurm-state

# report_failures NAME: under `set -e`, any failing command ends the script; say which one and
# where, so no failure path is silent (a bare `exit 1` from `set -e` printed nothing).
report_failures() {
    SCRIPT_STEP="$1"
    set -o errtrace  # the trap fires inside functions too
    # shellcheck disable=SC2154  # rc is assigned inside the trap string
    trap 'rc=$?; echo "slurm $SCRIPT_STEP: FAILED (exit $rc) at ${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND" >&2' ERR
}

# Daemons in start order: name, pid file, expected /proc/PID/comm (guards against pid reuse).
DAEMONS=(
    "munged $STATE/munge/munged.pid munged"
    "mariadbd $STATE/mysql-run/mariadbd.pid mariadbd"
    "slurmdbd $STATE/run/slurmdbd.pid slurmdbd"
    "slurmctld $STATE/run/slurmctld.pid slurmctld"
    "slurmd $STATE/run/slurmd.pid slurmd"
)

# pid_alive PIDFILE COMM: print the pid when the file names a live process called COMM.
pid_alive() {
    local pidfile="$1" comm="$2" pid
    [ -s "$pidfile" ] || return 1
    pid="$(tr -dc '0-9' <"$pidfile")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    echo "$pid"
}

log_tails() {
    local f
    for f in "$STATE"/log/*.log; do
        [ -f "$f" ] || continue
        echo "----- tail $f"
        tail -n 20 "$f"
    done
}
