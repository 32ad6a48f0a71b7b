#!/usr/bin/env bash
# Install the Debian packages of a single-node SLURM cluster with accounting (slurmdbd+MariaDB).
# Idempotent: does nothing when every binary is already present. Needs root and apt.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
report_failures install

needed=(munged slurmctld slurmd sbatch sacct sacctmgr slurmdbd mariadbd)
missing=()
for bin in "${needed[@]}"; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing+=("$bin")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "slurm install: all binaries present, nothing to do"
    exit 0
fi
echo "slurm install: missing ${missing[*]}; installing packages"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d: stop the package scripts from starting daemons; start.sh owns them.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends \
    munge slurmctld slurmd slurm-client slurmdbd mariadb-server >/dev/null
echo "slurm install: done ($(slurmctld -V))"
