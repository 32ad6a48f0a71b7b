#!/usr/bin/env bash
# GPU check, under 8 minutes on one GPU:
#  1. the tiny DAG (tests/tiny_config.yaml) with `device: cuda` and the local-gpu profile in a
#     temp folder; every GPU rule's log must say `device: cuda:<i> (<GPU name>)` (the line
#     distinctcap.core.devices.job_device writes at a job's start); without Java the DAG stops
#     after decode (the evaluation's text metrics need Java);
#  2. the trainer, entropy and feature benchmarks on the GPU, at COCO sizes where they have
#     them; their ratio lines are printed at the end.
# No usable GPU: exits 1 at once with one line saying why.
#
#   bench/gpu_check.sh [--cores N] [--keep DIR] [--no-dag] [--no-bench]
#
# Environment: PYTHON (default python3), SNAKEMAKE (default: the snakemake beside PYTHON, else
# on PATH).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
CORES=$(nproc)
KEEP=""
RUN_DAG=1
RUN_BENCH=1

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 1; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --cores) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--cores needs a number"
                 CORES=$2; shift 2 ;;
        --keep) [[ $# -ge 2 ]] || die "--keep needs a folder"; KEEP=$2; shift 2 ;;
        --no-dag) RUN_DAG=0; shift ;;
        --no-bench) RUN_BENCH=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1

# -- 0. a usable GPU, or one line why not -------------------------------------------------------
"$PYTHON" - <<'EOF' || exit 1
import sys
from distinctcap.core.devices import cuda_problem, gpu_requirement
problem = cuda_problem()
if problem:
    sys.exit(f"gpu_check: no usable GPU: {problem}; {gpu_requirement()}")
import torch
print(f"gpu_check: {torch.cuda.device_count()} GPU(s), cuda:0 = "
      f"{torch.cuda.get_device_name(0)}, {gpu_requirement()}")
EOF

SNAKEMAKE=${SNAKEMAKE:-$(dirname "$(command -v "$PYTHON")")/snakemake}
[[ -x "$SNAKEMAKE" ]] || SNAKEMAKE=$(command -v snakemake || true)

WORK=${KEEP:-$(mktemp -d -t distinctcap-gpu-check.XXXXXX)}
mkdir -p "$WORK"
if [[ -z "$KEEP" ]]; then trap 'rm -rf "$WORK"' EXIT; fi
RESULTS=()
START=$SECONDS

# -- 1. the tiny DAG on the GPU ---------------------------------------------------------------
if [[ $RUN_DAG == 1 ]]; then
    [[ -n "$SNAKEMAKE" ]] || die "snakemake not found (set SNAKEMAKE)"
    cp -r "$ROOT/Snakefile" "$ROOT/workflow" "$ROOT/envs" "$WORK/"
    sed -e '/^device:/d' "$ROOT/tests/tiny_config.yaml" > "$WORK/config.yaml"
    echo "device: cuda" >> "$WORK/config.yaml"
    until=()
    if ! command -v java > /dev/null; then
        echo "gpu_check: no java on PATH: the DAG stops after decode (no evaluation)"
        until=(--until decode)
    fi
    echo "gpu_check: tiny DAG in $WORK ($CORES cores)"
    if ! (cd "$WORK" && "$SNAKEMAKE" --workflow-profile "$ROOT/workflow/profiles/local-gpu" \
            --cores "$CORES" --printshellcmds "${until[@]}" > snakemake.log 2>&1); then
        tail -n 40 "$WORK/snakemake.log" >&2
        die "the tiny DAG failed (log: $WORK/snakemake.log; --keep DIR keeps it)"
    fi
    # Every job of a rule that takes the config's device must have run on the GPU.
    mapfile -t logs < <(cd "$WORK" && find logs/features logs/train logs/decode logs/entropy \
        logs/neighbours logs/evaluate -name '*.log' 2> /dev/null \
        | grep -v -e split_entropy -e entropy_report -e summarize -e report_ | sort)
    [[ ${#logs[@]} -gt 0 ]] || die "no GPU rule logs under $WORK/logs"
    bad=()
    for log in "${logs[@]}"; do
        grep -q -E 'INFO distinctcap\.devices: device: cuda:[0-9]+ \(.+\)' "$WORK/$log" \
            || bad+=("$log")
    done
    if [[ ${#bad[@]} -gt 0 ]]; then
        die "${#bad[@]} of ${#logs[@]} GPU jobs did not run on CUDA: ${bad[*]}"
    fi
    line=$(grep -h -o -E 'device: cuda:[0-9]+ \(.+\)' "$WORK/${logs[0]}" | head -n 1)
    RESULTS+=("tiny DAG: ${#logs[@]} GPU jobs, each on CUDA ($line), $((SECONDS - START)) s")
fi

# -- 2. benchmarks on the GPU -----------------------------------------------------------------
bench() {  # name, then the command; its ratio lines go to RESULTS
    local name=$1 out
    shift
    echo "gpu_check: $name: $*"
    out=$("$@" 2>&1) || { echo "$out" >&2; die "$name failed"; }
    echo "$out"
    while IFS= read -r line; do RESULTS+=("$name: $line"); done \
        < <(grep -i 'ratio' <<< "$out")
}
if [[ $RUN_BENCH == 1 ]]; then
    threads=$((CORES < 8 ? CORES : 8))
    bench "trainer (shapes size)" "$PYTHON" "$ROOT/bench/bench_trainer.py" --device cuda \
        --steps 60 --reps 3 --threads "$threads"
    bench "trainer (COCO size)" "$PYTHON" "$ROOT/bench/bench_trainer.py" --device cuda --coco \
        --steps 40 --reps 2 --threads "$threads"
    bench "entropy" "$PYTHON" "$ROOT/bench/bench_entropy.py" --device cuda --reps 3
    bench "features (COCO size)" "$PYTHON" "$ROOT/bench/bench_features.py" --device cuda \
        --coco --images 2048 --workers 0 4 "$((CORES > 2 ? CORES - 1 : 1))"
fi

echo
echo "gpu_check: passed in $((SECONDS - START)) s"
for line in "${RESULTS[@]}"; do echo "  $line"; done
