#!/usr/bin/env bash
# Stop the cluster started by start.sh: cancel its jobs, then stop the daemons in reverse
# order by the pid files in the state dir (never by process name), each wait bounded.
# Then the state dir (database, munge key, job state) is removed, so the next start.sh begins
# from an empty one as a new machine would; SLURM_KEEP_STATE=1 keeps it for a quicker restart.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
report_failures stop
WAIT="${SLURM_STOP_TIMEOUT:-30}"

if pid_alive "$STATE/run/slurmctld.pid" slurmctld >/dev/null; then
    # Jobs left running would keep slurmstepd processes alive after slurmd exits.
    mapfile -t jobs < <(timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [ "${#jobs[@]}" -gt 0 ]; then
        timeout 10 scancel "${jobs[@]}" || true
        end=$((SECONDS + 15))
        while [ -n "$(timeout 10 squeue -h -t running,completing -o %i 2>/dev/null || true)" ] &&
            [ "$SECONDS" -lt "$end" ]; do
            sleep 0.5
        done
    fi
fi

status=0
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
    read -r name pidfile comm <<<"${DAEMONS[$i]}"
    pid="$(pid_alive "$pidfile" "$comm")" || { rm -f "$pidfile"; continue; }
    kill -TERM "$pid"
    end=$((SECONDS + WAIT))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "slurm stop: $name (pid $pid) ignored SIGTERM for ${WAIT}s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        status=1
    fi
    rm -f "$pidfile"
    echo "slurm stop: $name stopped"
done

if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null || true)" = "$SLURM_CONF" ]; then
    rm -f /etc/slurm/slurm.conf
fi
if [ "${SLURM_KEEP_STATE:-0}" != 1 ] && [ -e "$STATE/$STATE_MARK" ]; then
    rm -rf "$STATE"
    echo "slurm stop: state dir $STATE removed"
fi
exit "$status"
