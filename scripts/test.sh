#!/usr/bin/env bash
# Every test: formatting and lints, the Rust test suites (ABI layout and
# header drift included), and the C/C++ side through CMake and ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast
else
    cargo test --workspace --no-fail-fast
fi
# Doc tests (nextest does not run them).
cargo test --workspace --doc

# Exhaustive interleavings (loom) of the governor's lock-free fast path,
# of the deferred-free queue and of the C API's handle slot table;
# its own target dir, since --cfg loom rebuilds everything.
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
    cargo test -p memplug-host --release --test governor_loom --test deferred_loom
CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
    cargo test -p memplug-host-capi --release --test slot_table_loom

cmake -S . -B target/cmake-build -G Ninja -DCMAKE_BUILD_TYPE=Debug
cmake --build target/cmake-build
ctest --test-dir target/cmake-build --output-on-failure
