#!/usr/bin/env bash
# The Python package's tests: a virtual environment under the target
# directory with maturin, numpy and pytest from the package registry; the
# abi3 wheel built by maturin (python/) and installed into it; pytest over
# python/tests (which also runs examples/python/kv_cache.py).
#   scripts/python-test.sh [pytest args...]
# MEMPLUG_PYTHON_CONSUMERS=1 also installs PyTorch and JAX (CPU; several GiB
# and minutes: PyTorch's wheel brings CUDA libraries), whose tests in
# python/tests/test_consumers.py are skipped, saying so, without them.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$target/python-venv"

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "python-test: installing python3-venv"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.5,<2" numpy pytest
if [ "${MEMPLUG_PYTHON_CONSUMERS:-0}" = 1 ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check torch jax
fi

# The extension has its own cargo workspace (python/Cargo.toml) and target
# directory, so its pyo3 build never invalidates the workspace's.
wheels="$target/python-wheels"
rm -rf "$wheels"
CARGO_TARGET_DIR="$target/python" "$venv/bin/maturin" build --release \
    --manifest-path python/Cargo.toml --interpreter "$venv/bin/python" --out "$wheels" --quiet
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/memplug-*.whl
"$venv/bin/python" -m pytest -q -rs python/tests "$@"
