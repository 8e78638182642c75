#!/usr/bin/env bash
# The Python package's CI, as a user installs it: builds one abi3 wheel (CPython 3.9 and later)
# with maturin, installs it into a fresh virtual environment with no Rust toolchain on PATH, and
# runs the pytest suite against that install. Then the same wheel, unchanged, goes into a
# CPython 3.9 environment (where one is on the machine) for the tests that need only numpy.
#
#   bash python/ci.sh            # from the repository root (any directory works)
#
# Needs a Rust toolchain (cargo) to build and Python >= 3.9 with pip; PYTHON picks the
# interpreter (default python3). The test dependencies (numpy, hypothesis, pytest, torch,
# torchvision, onnx, onnxscript, onnxruntime) go into that interpreter's
# site-packages, which the virtual environment sees (`--system-site-packages`) so that torch is
# not downloaded twice; deformconv itself is only in the virtual environment. Exits non-zero on
# any failure.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"

echo "== python/ci.sh: $("$py" --version) at $(command -v "$py")"
"$py" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.9,<2" numpy hypothesis pytest "torch==2.15.0" "torchvision==0.29.2" \
    onnx onnxscript onnxruntime

# Build once.
wheels="$repo/target/python-wheels"
rm -rf "$wheels"
(cd "$repo" && "$py" -m maturin build --release --manifest-path python/Cargo.toml \
    --interpreter "$py" --out "$wheels")
wheel=$(ls "$wheels"/deformconv-*-abi3-*.whl)
echo "== python/ci.sh: built $(basename "$wheel")"

# Install anywhere: a fresh environment, and a PATH with no cargo, rustc or maturin on it.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
no_rust_path=/usr/local/bin:/usr/bin:/bin
"$py" -m venv --system-site-packages "$work/venv"
env PATH="$work/venv/bin:$no_rust_path" bash -c '
    set -euo pipefail
    if command -v cargo || command -v rustc; then echo "a Rust toolchain is on PATH"; exit 1; fi
    # Into the venv itself even where the base interpreter has a deformconv of its own.
    python -m pip install --quiet --disable-pip-version-check --no-index --ignore-installed --no-deps "$1"
' _ "$wheel"
# Run from an empty directory so that `import deformconv` is the installed package, not the
# source tree (which has no compiled extension).
cd "$work"
start=$(date +%s)
env PATH="$work/venv/bin:$no_rust_path" python -c '
import deformconv, sys
assert deformconv.__file__.startswith(sys.prefix), deformconv.__file__
print("== python/ci.sh: testing", deformconv.__file__)'
env PATH="$work/venv/bin:$no_rust_path" python -m pytest "$repo/python/tests" -p no:cacheprovider -q
echo "== python/ci.sh: pytest took $(( $(date +%s) - start )) s"

# The same wheel on the oldest CPython it claims, where the machine has one (pyenv's): the
# numpy API, the oracle and the golden cases (torch 2.15 has no wheel for 3.9).
py39=""
for candidate in "$(pyenv root 2>/dev/null)"/versions/3.9*/bin/python3.9 "$(command -v python3.9 || true)"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
        py39=$candidate
        break
    fi
done
if [ -n "$py39" ] && "$py39" -m venv "$work/venv39"; then
    "$work/venv39/bin/python" -m pip install --quiet --disable-pip-version-check numpy hypothesis pytest "$wheel"
    env PATH="$work/venv39/bin:$no_rust_path" python -m pytest -p no:cacheprovider -q \
        "$repo/python/tests/test_numpy_api.py" "$repo/python/tests/test_golden.py"
else
    echo "NOTE: no CPython 3.9 on this machine; the abi3 wheel was tested on $("$py" --version) only"
fi
