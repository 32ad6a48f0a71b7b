#!/usr/bin/env bash
# Install Debian's Chromium for the report screenshot test (the pipeline test renders the report's
# front page headless through distinctcap.report.browser). No Playwright, no downloaded browser.
# Idempotent: does nothing when /usr/bin/chromium is already present. Needs root and apt.
set -euo pipefail
# Under `set -e` say which command failed and where, as the slurm scripts do (common.sh).
# shellcheck disable=SC2154  # rc is assigned inside the trap string
trap 'rc=$?; echo "chromium install: FAILED (exit $rc) at ${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND" >&2' ERR

if [ -x /usr/bin/chromium ]; then
    echo "chromium install: /usr/bin/chromium present, nothing to do"
    exit 0
fi
echo "chromium install: /usr/bin/chromium missing; installing the Debian package"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
echo "chromium install: done ($(/usr/bin/chromium --version 2>/dev/null))"
