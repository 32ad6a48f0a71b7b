#!/usr/bin/env bash
# The prepared device check: the measurements that matter for COCO on one GPU, sized for one
# device call of at most 9 minutes with the machine's start (issue 42), on the GPU machine as it
# is: python3 3.12 with torch and no package index. What that image lacks travels as wheels in
# .whl/ (`make gpu-wheels`; carry .whl), installed here with pip --no-index --target first.
# Then one JSON line per part to $OUT/gpu_check.jsonl as each part ends (part, command, rc,
# seconds, limit_s, card, the part's number lines, its output tail, or skipped with the
# reason), and each part's whole log to $OUT/part-NAME.log, so a lease cut short still returns
# what finished:
#   imports  each part's modules import (one line naming every missing module, by part)
#   a  features on 4,096 COCO-sized JPEGs, end to end vs model only  (bench_features.py, 70 s)
#   b  MLE, UNKT and specificity steps at COCO size, eager vs compiled (bench_steps.py, 180 s;
#      prints each ms/step, compile time and ratio as it exists, and all of them on SIGTERM)
#   c  bench_scale.py at 118,287 images: train, decode, evaluate    (peak RSS and s, 170 s)
#   d  the rehearsal of config.coco.yaml (bench/rehearsal.py; not in the default: it needs
#      snakemake's packages too)
#   dag  the tiny DAG on the GPU, every GPU job's log on CUDA      (only with --dag; ~350 s)
# Each part runs under `timeout` (its limit; --limit PART=SECONDS sets another); a part whose
# script or flag is missing is recorded as skipped. Exit 0 only if every part ran, exited 0
# and printed a number; else 1. No usable GPU: one JSON line saying why, exit 1 (unless --cpu).
#
#   OUT=DIR bash bench/gpu_check.sh [--parts a,b,c] [--limit b=480 ...] [--dag] [--cpu] [--keep DIR]
#
# --cpu runs the parts on the CPU at tiny sizes with short limits (the test of this script;
# bench/gpu/rehearsal.sh runs it in a venv holding only the GPU image's packages).
# Environment: OUT (default: a temp folder), PYTHON (default: .venv/bin/python if there, else
# python3), WHEELS (default .whl: installed first if it holds wheels), SNAKEMAKE (for --dag).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    [[ -x "$ROOT/.venv/bin/python" ]] && PYTHON="$ROOT/.venv/bin/python"
fi
OUT=${OUT:-$(mktemp -d -t distinctcap-gpu-out.XXXXXX)}
WHEELS=${WHEELS:-$ROOT/.whl}
PARTS=a,b,c
KEEP=""
CPU=0
RUN_DAG=0
declare -A LIMIT=()

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --parts) [[ $# -ge 2 ]] || die "--parts needs a list"; PARTS=$2; shift 2 ;;
        --dag) RUN_DAG=1; shift ;;
        --cpu) CPU=1; shift ;;
        --keep) [[ $# -ge 2 ]] || die "--keep needs a folder"; KEEP=$2; shift 2 ;;
        --limit) [[ $2 =~ ^[a-z]+=[0-9]+$ ]] || die "--limit needs PART=SECONDS"
            LIMIT[${2%%=*}]=${2#*=}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1
mkdir -p "$OUT"
JSONL="$OUT/gpu_check.jsonl"
WORK=${KEEP:-$(mktemp -d -t distinctcap-gpu-check.XXXXXX)}  # outside $OUT: stores are GBs
mkdir -p "$WORK"
if [[ -z "$KEEP" ]]; then trap 'rm -rf "$WORK"' EXIT; fi
START=$SECONDS

card() {  # nvidia-smi's name of GPU 0 (no torch import: seconds on a busy box)
    nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1 | grep . \
        || echo "no GPU ($(nproc) CPU cores)"
}
CARD=$(card)

# One JSON line: part, command, rc, seconds, limit, card, the matching lines and the log's tail.
record() {  # part, rc, seconds, limit, log file, pattern, skipped reason, command...
    local part=$1 rc=$2 seconds=$3 limit=$4 log=$5 pattern=$6 skipped=$7
    shift 7
    PART=$part RC=$rc SECS=$seconds LIMIT=$limit LOG=$log PATTERN=$pattern SKIPPED=$skipped \
    CARD=$CARD COMMAND="$*" "$PYTHON" - >> "$JSONL" <<'EOF'
import json, os, re
log = os.environ["LOG"]
text = open(log, errors="replace").read() if log and os.path.isfile(log) else ""
pattern = re.compile(os.environ["PATTERN"], re.I) if os.environ["PATTERN"] else None
rc = os.environ["RC"]
lines = [line for line in text.splitlines() if pattern and pattern.search(line)]
print(json.dumps({
    "part": os.environ["PART"], "command": os.environ["COMMAND"],
    "rc": int(rc) if rc else None, "seconds": float(os.environ["SECS"]),
    "limit_s": int(os.environ["LIMIT"]), "card": os.environ["CARD"],
    "timed_out": rc in ("124", "137"), "skipped": os.environ["SKIPPED"] or None,
    "lines": lines,
    "numbers": sum(bool(re.search(r"\d", line)) for line in lines),
    "tail": text[-3000:],
}))
EOF
}

# part NAME LIMIT PATTERN NEEDS -- COMMAND...: NEEDS is "script flag..." that must exist.
part() {
    local name=$1 limit=${LIMIT[$1]:-$2} pattern=$3 needs=$4 log="$WORK/$1.log" started rc
    shift 5
    [[ ",$PARTS," == *",$name,"* ]] || return 0
    read -r -a need <<< "$needs"
    if [[ ! -f "$ROOT/${need[0]}" ]]; then
        record "$name" "" 0 "$limit" "" "" "${need[0]} is missing" "$@"
        echo "gpu_check: $name skipped: ${need[0]} is missing"; FAILED+=("$name"); return 0
    fi
    for flag in "${need[@]:1}"; do
        if ! grep -q -e "\"$flag\"" -e "'$flag'" "$ROOT/${need[0]}"; then
            record "$name" "" 0 "$limit" "" "" "${need[0]} has no $flag" "$@"
            echo "gpu_check: $name skipped: ${need[0]} has no $flag"; FAILED+=("$name")
            return 0
        fi
    done
    if [[ -n "${MISSING[$name]:-}" ]]; then
        record "$name" "" 0 "$limit" "" "" "missing modules: ${MISSING[$name]}" "$@"
        echo "gpu_check: $name skipped: missing modules: ${MISSING[$name]}"; FAILED+=("$name")
        return 0
    fi
    echo "gpu_check: $name (limit ${limit} s): $*"
    started=$SECONDS
    (cd "$ROOT" && timeout -k 10 "$limit" "$@") > "$log" 2>&1
    rc=$?
    cp "$log" "$OUT/part-$name.log"
    record "$name" "$rc" "$((SECONDS - started))" "$limit" "$log" "$pattern" "" "$@"
    grep -i -E "$pattern" "$log" | sed "s/^/  $name: /"
    if [[ $rc != 0 ]] || ! grep -i -E "$pattern" "$log" | grep -q '[0-9]'; then
        FAILED+=("$name")
        echo "gpu_check: $name failed (rc $rc, or no number); its tail:"; tail -n 5 "$log"
    fi
}

# -- the wheels the image lacks, then every part's imports --------------------------------------
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    SITE="$WORK/site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl > "$WORK/wheels.log" 2>&1 \
        || { cat "$WORK/wheels.log" >&2; die "installing $WHEELS/*.whl failed"; }
    export PYTHONPATH="$PYTHONPATH:$SITE"
    echo "gpu_check: installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS"
fi

# -- a usable GPU, or one line why not ----------------------------------------------------------
no_gpu() {  # the reason is the last line of $WORK/gpu.log
    record gpu 1 "$((SECONDS - START))" 0 "$WORK/gpu.log" "no usable GPU" "" "$1"
    echo "gpu_check: $(tail -n 1 "$WORK/gpu.log") (written to $JSONL)" >&2
    exit 1
}
if [[ $CPU == 0 ]]; then
    if ! command -v nvidia-smi > /dev/null; then  # no driver: say so without importing torch
        echo "no usable GPU: no nvidia-smi on PATH (no NVIDIA driver)" > "$WORK/gpu.log"
        no_gpu "command -v nvidia-smi"
    fi
    if ! "$PYTHON" - > "$WORK/gpu.log" 2>&1 <<'EOF'
import sys
from distinctcap.core.devices import cuda_problem, gpu_requirement
problem = cuda_problem()
if problem:
    sys.exit(f"no usable GPU: {problem}; {gpu_requirement()}")
EOF
    then
        no_gpu "distinctcap.core.devices.cuda_problem"
    fi
    DEVICE=cuda
else
    DEVICE=cpu
fi
echo "gpu_check: $CARD; device $DEVICE; results to $JSONL"

# Each part's script (its top-level imports) and the modules it imports later, inside functions
declare -A IMPORTS=(
    [a]="bench/bench_features.py open_clip torchvision.io distinctcap.features.extract"
    [b]="bench/bench_steps.py open_clip distinctcap.methods.specificity distinctcap.methods.unkt"
    [c]="bench/bench_scale.py bench/synthetic_store.py distinctcap.train.launch open_clip
         jsonschema pycocoevalcap.bleu.bleu_scorer distinctcap.evaluate.stage"
    [d]="bench/rehearsal.py snakemake jsonschema"
    [dag]="snakemake jsonschema pycocoevalcap"
)
declare -A MISSING=()
FAILED=()
wanted=()
for name in ${PARTS//,/ } $([[ $RUN_DAG == 1 ]] && echo dag); do
    wanted+=("$name=${IMPORTS[$name]:-}")
done
missing=$(cd "$ROOT" && CARD=$CARD "$PYTHON" - "$JSONL" "${wanted[@]}" <<'EOF'
import importlib, importlib.util, json, os, sys
sys.path[:0] = ["bench"]
missing = {}
for item in sys.argv[2:]:
    part, _, modules = item.partition("=")
    for module in modules.split():
        try:
            if module.endswith(".py"):  # registered first: dataclasses look their module up
                name = os.path.basename(module)[:-3]
                spec = importlib.util.spec_from_file_location(name, module)
                sys.modules[name] = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(sys.modules[name])
            else:
                importlib.import_module(module)
        except ImportError as error:
            name = getattr(error, "name", None) or str(error)
            if name not in missing.setdefault(part, []):
                missing[part].append(name)
        except Exception as error:  # noqa: BLE001 - any failure to import is the part's
            missing.setdefault(part, []).append(f"{module} ({type(error).__name__}: {error})")
with open(sys.argv[1], "a") as out:
    line = {"part": "imports", "rc": int(bool(missing)), "card": os.environ["CARD"],
            "missing": missing, "python": sys.version.split()[0]}
    out.write(json.dumps(line) + "\n")
for part, names in missing.items():
    print(f"{part}={','.join(names)}")
EOF
) || die "the imports check failed to run ($PYTHON)"
while IFS='=' read -r name modules; do
    [[ -n "$name" ]] && MISSING[$name]=$modules
done <<< "$missing"
for name in "${!MISSING[@]}"; do echo "gpu_check: part $name is missing modules: ${MISSING[$name]}"; done

RATES='ratio|rate|/s\b|ms/step|compile|peak|GiB|total'
STEPS=(bench/bench_steps.py --methods mle,unkt,specificity)
if [[ $CPU == 0 ]]; then
    part a 70 "$RATES" "bench/bench_features.py --coco-jpegs" -- \
        "$PYTHON" bench/bench_features.py --coco-jpegs 4096 --device cuda
    part b 180 "$RATES" "bench/bench_steps.py --coco --methods" -- \
        "$PYTHON" "${STEPS[@]}" --coco --device cuda
    part c 170 "$RATES" "bench/bench_scale.py --sizes --stages --test-images --store-grid-cache" \
        -- "$PYTHON" bench/bench_scale.py --sizes 118287 --stages train,decode,evaluate \
        --train-steps 20 --max-len 5 --test-images 250 --store-grid-cache --device cuda \
        --root "$WORK/scale"
    rm -rf "$WORK/scale"  # GBs, left behind when its limit stopped it
    part d 80 "$RATES|rehearsal" "bench/rehearsal.py --budget" -- \
        "$PYTHON" bench/rehearsal.py --images 2000 --steps 50 --device cuda --budget 65 \
        --work "$WORK/rehearsal" --out "$OUT/rehearsal.json"
else  # the same parts, CPU-sized
    part a 60 "$RATES" "bench/bench_features.py --coco-jpegs --arch --workers" -- \
        "$PYTHON" bench/bench_features.py --coco-jpegs 64 --arch shapes-vit-tiny --workers 1 \
        --device cpu
    part b 90 "$RATES" "bench/bench_steps.py --methods" -- \
        "$PYTHON" "${STEPS[@]}" --device cpu --steps 2 --reps 1 --warmup 2 --images 200 \
        --backend eager
    part c 90 "$RATES" "bench/bench_scale.py --sizes --stages" -- \
        "$PYTHON" bench/bench_scale.py --sizes 1200 --stages train --train-steps 1 \
        --device cpu --root "$WORK/scale"
    part d 120 "$RATES|rehearsal" "bench/rehearsal.py --budget" -- \
        "$PYTHON" bench/rehearsal.py --images 8 --steps 1 --device cpu --budget 60 \
        --work "$WORK/rehearsal" --out "$OUT/rehearsal.json" --workers 0 --target \
        results/data/images.parquet
fi

# -- the tiny DAG on the GPU (only with --dag) --------------------------------------------------
if [[ $RUN_DAG == 1 ]]; then
    SNAKEMAKE=${SNAKEMAKE:-$(dirname "$(command -v "$PYTHON")")/snakemake}
    [[ -x "$SNAKEMAKE" ]] || SNAKEMAKE=$(command -v snakemake || true)
    dag="$WORK/dag"
    mkdir -p "$dag"
    cp -r "$ROOT/Snakefile" "$ROOT/workflow" "$ROOT/envs" "$dag/"
    sed -e '/^device:/d' "$ROOT/tests/tiny_config.yaml" > "$dag/config.yaml"
    echo "device: $DEVICE" >> "$dag/config.yaml"
    until=()
    command -v java > /dev/null || until=(--until decode)  # the text metrics need Java
    cat > "$WORK/dag.sh" <<EOF
cd "$dag" && "$SNAKEMAKE" --workflow-profile "$ROOT/workflow/profiles/local-gpu" \
    --cores "$(nproc)" ${until[*]} || exit \$?
bad=0
for log in \$(find logs/features logs/train logs/decode logs/entropy logs/neighbours \
        logs/evaluate -name '*.log' 2> /dev/null | grep -v -e split_entropy -e entropy_report \
        -e summarize -e report_); do
    grep -q -E 'device: cuda:[0-9]+ \(.+\)' "\$log" && echo "on CUDA: \$log" \
        || { echo "NOT on CUDA: \$log"; bad=1; }
done
exit \$bad
EOF
    part dag 420 "on CUDA|NOT on CUDA" "Snakefile" -- bash "$WORK/dag.sh"
fi

echo "gpu_check: done in $((SECONDS - START)) s; $(wc -l < "$JSONL") lines in $JSONL"
if [[ ${#FAILED[@]} -gt 0 || ${#MISSING[@]} -gt 0 ]]; then
    echo "gpu_check: FAILED: ${FAILED[*]:-} ${MISSING[*]:+(missing modules in ${!MISSING[*]})}" >&2
    exit 1
fi
