#!/usr/bin/env bash
# The Python package's CI: installs what it needs into the current Python environment (maturin,
# numpy, hypothesis, pytest, torch and torchvision from the package index), builds the wheel from
# this checkout, installs it, and runs the pytest suite against the installed package.
#
#   bash python/ci.sh            # from the repository root (any directory works)
#
# Needs a Rust toolchain (cargo) and Python >= 3.9 with pip; PYTHON picks the interpreter
# (default python3). Exits non-zero on any failure.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"

echo "== python/ci.sh: $("$py" --version) at $(command -v "$py")"
"$py" -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.9,<2" numpy hypothesis pytest "torch==2.15.0" "torchvision==0.29.2"

wheels="$repo/target/python-wheels"
rm -rf "$wheels"
(cd "$repo" && "$py" -m maturin build --release --manifest-path python/Cargo.toml \
    --interpreter "$py" --out "$wheels")
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheels"/deformconv-*.whl

# Run from an empty directory so that `import deformconv` is the installed package, not the
# source tree (which has no compiled extension).
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
start=$(date +%s)
"$py" -m pytest "$repo/python/tests" -p no:cacheprovider -q
echo "== python/ci.sh: pytest took $(( $(date +%s) - start )) s"
