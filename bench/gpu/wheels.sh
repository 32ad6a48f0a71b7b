#!/usr/bin/env bash
# Download the wheels that a GPU node without a package index needs (bench/gpu/carried.txt) for
# its Python, one version each, no dependencies: copy the folder to the node and install with
#   python3 -m pip install --no-index --no-deps --target DIR FOLDER/*.whl; export PYTHONPATH=DIR
# (bench/gpu_check.sh does that itself when it finds the folder).
#
#   bash bench/gpu/wheels.sh [--python-version 3.12] [--dest .whl] [--python PYTHON]
# (PYTHON: the Python whose pip downloads; default python3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VERSION=3.12
DEST=$ROOT/.whl
PY=python3
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python-version) VERSION=$2; shift 2 ;;
        --dest) DEST=$2; shift 2 ;;
        --python) PY=$2; shift 2 ;;
        *) echo "wheels.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # one version of each: two stop the node's install
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
TRIM=$(mktemp -d)
trap 'rm -rf "$TRIM"' EXIT
pinned() {  # NAME -> NAME==VERSION from requirements.txt, or one line why not
    grep -i -m 1 "^$1==" "$ROOT/requirements.txt" \
        || { echo "wheels.sh: $1 has no version in carried.txt or requirements.txt" >&2; exit 2; }
}
grep -v -e '^#' -e '^$' "$ROOT/bench/gpu/carried.txt" | while read -r requirement how; do
    [[ "$requirement" == *==* ]] || requirement=$(pinned "$requirement")
    into=$DEST
    [[ "$how" == trim ]] && into=$TRIM
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$VERSION" \
        --implementation cp "${platforms[@]}" -d "$into" "$requirement"
done
for wheel in "$TRIM"/*.whl; do
    [[ -e "$wheel" ]] && "$PY" "$ROOT/bench/gpu/trim_wheel.py" "$wheel" "$DEST"
done
echo "wheels.sh: $(ls "$DEST"/*.whl | wc -l) wheels for Python $VERSION in $DEST ($(du -sh "$DEST" | cut -f1))"
