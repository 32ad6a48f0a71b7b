#!/usr/bin/env bash
# The GPU machine, rehearsed on this one (issue 42): a clean venv holding only the GPU image's
# packages that distinctcap uses (bench/gpu/image.txt) at its torch and torchvision versions
# (bench/gpu/torch.txt; requirements.txt pins the others), none of the carried ones; the carried
# wheels (bench/gpu/carried.txt) downloaded for this Python and installed as on the node (pip
# --no-index --no-deps --target, by gpu_check.sh); then `gpu_check.sh --cpu` with no package
# index; then the compile tests (tests/test_device_path.py), which count graph breaks. Its exit
# status is 0 only if every part ran and printed a number and every test passed.
#
#   bash bench/gpu/rehearsal.sh [gpu_check.sh arguments, e.g. --parts a,b]
# Environment: REHEARSAL (default .gpu-rehearsal: the venv, the wheels and OUT), OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=${REHEARSAL:-$ROOT/.gpu-rehearsal}
VENV=$HERE/venv
IMAGE=$ROOT/bench/gpu/image.txt
TORCH=$ROOT/bench/gpu/torch.txt
WANTED=$(cat "$IMAGE" "$TORCH" "$ROOT/requirements.txt")
if [[ "$WANTED" != "$(cat "$VENV/wanted.txt" 2> /dev/null)" ]]; then  # new, or a list changed
    echo "rehearsal: a clean venv with the GPU image's packages in $VENV (minutes)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # requirements.txt's pins less torch's and torchvision's, which torch.txt's replace (pip
    # refuses two pins of one package)
    grep -v -i -E '^(torch|torchvision)==' "$ROOT/requirements.txt" | cat - "$TORCH" \
        > "$VENV/constraints.txt"
    "$VENV/bin/python" -m pip install --quiet -r "$IMAGE" -c "$VENV/constraints.txt"
    echo "$WANTED" > "$VENV/wanted.txt"
fi
# The carried packages must come from the wheels alone, as on the node
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
present = [m for m in ("open_clip", "ftfy", "jsonschema", "rpds", "pycocoevalcap", "snakemake",
                       "distinctcap") if importlib.util.find_spec(m)]
if present:
    sys.exit(f"rehearsal: the venv must not hold {present}: remove it and run again")
import torch, torchvision
print(f"rehearsal: torch {torch.__version__}, torchvision {torchvision.__version__}")
PY
PYVER=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
bash "$ROOT/bench/gpu/wheels.sh" --python-version "$PYVER" --dest "$HERE/whl" \
    --python "$VENV/bin/python"
export PIP_NO_INDEX=1 OUT=${OUT:-$HERE/out}
rm -rf "$OUT"
echo "rehearsal: bench/gpu_check.sh --cpu $* with $VENV/bin/python, wheels from $HERE/whl"
PYTHON=$VENV/bin/python WHEELS=$HERE/whl bash "$ROOT/bench/gpu_check.sh" --cpu "$@" || checked=$?
# gpu_check does not count graph breaks: the compile tests do, under the same torch and wheels
SITE=$HERE/site
rm -rf "$SITE"
"$VENV/bin/python" -m pip install -q --no-deps --no-compile --target "$SITE" "$HERE"/whl/*.whl
echo "rehearsal: tests/test_device_path.py (compiled = eager, no graph break) under that torch"
PYTHONPATH="$ROOT/src:$SITE" HF_HUB_OFFLINE=1 MPLBACKEND=Agg "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider "$ROOT/tests/test_device_path.py" || tested=$?
exit $(( ${checked:-0} || ${tested:-0} ))
