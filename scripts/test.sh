#!/usr/bin/env bash
# Every test: formatting and lints, the Rust test suites (ABI layout and
# header drift included), and the C/C++ side through CMake and ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed as it ends and again at the close, so a
# run over its budget says where the time went.
phases=""
phase_start=$SECONDS
phase() {
    local took=$((SECONDS - phase_start))
    phases+="$(printf '%5d s  %s' "$took" "$1")"$'\n'
    echo "test.sh: $1 took ${took} s (${SECONDS} s in all)"
    phase_start=$SECONDS
}
trap 'echo "test.sh: phases so far:"; printf "%s" "$phases"' EXIT
scripts/setup.sh test
phase "set-up"

export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
phase "formatting and lints"

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast
else
    cargo test --workspace --no-fail-fast
fi
phase "the Rust test suites"
# Doc tests (nextest does not run them).
cargo test --workspace --doc
# The host's optional tracing events (feature `tracing`; `serde` is on
# through the C API crate already).
cargo test -p memplug-host --features tracing --test observe_tracing
# API docs for the whole workspace (no two libraries of one name);
# memplug-host, memplug-sdk and memplug-host-capi deny missing docs, and a
# warning (a broken intra-doc link) fails here.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
phase "doc tests, tracing, API docs"

# The crates meant for crates.io package and build from their packages,
# with both license texts.
scripts/package-check.sh
phase "packages"

# Exhaustive interleavings (loom) of the governor's lock-free fast path,
# of the operation gate of a context,
# of the deferred-free queue, of the C API's handle slot table and of the
# node link's gate; its own target dir, since --cfg loom rebuilds
# everything, without debug info (nothing here reads it; about 80 s less
# to build). The node's costs one test binary: the C API's build compiled
# the crate already.
loom_test() {
    CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" CARGO_PROFILE_RELEASE_DEBUG=0 \
        cargo test --release "$@"
}
loom_test -p memplug-host --test governor_loom --test deferred_loom --test gate_loom
loom_test -p memplug-host-capi --test slot_table_loom
loom_test -p memplug-node --test link_loom
phase "loom"

# CMake builds the Rust libraries under its build directory unless told
# where: every configuration below reuses the debug libraries the cargo
# tests above built.
cargo_target="${CARGO_TARGET_DIR:-$PWD/target}"
cmake -S . -B target/cmake-build -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMEMPLUG_CARGO_TARGET_DIR="$cargo_target"
cmake --build target/cmake-build
ctest --test-dir target/cmake-build --output-on-failure
phase "C and C++ (debug, sanitizers)"

# The C side again at -O2 (gcc warns there where -O0 does not), against the
# same debug Rust libraries, so cargo builds nothing twice.
cmake -S . -B target/cmake-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMPLUG_CARGO_PROFILE=debug \
    -DMEMPLUG_CARGO_TARGET_DIR="$cargo_target"
cmake --build target/cmake-release
ctest --test-dir target/cmake-release --output-on-failure
phase "C and C++ (-O2)"

# Warning-free (-Werror) at every optimisation level with both compilers:
# build only (the tests ran above). clang's sanitizer runtime is not
# installed here, so these cells leave the ASan programs out.
for cell in "gcc g++ -O3" "clang clang++ -O0" "clang clang++ -O2" "clang clang++ -O3"; do
    read -r cc cxx opt <<<"$cell"
    cmake -S . -B "target/cmake-$cc$opt" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_C_FLAGS_RELEASE="$opt -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="$opt -DNDEBUG" \
        -DMEMPLUG_CARGO_PROFILE=debug -DMEMPLUG_CARGO_TARGET_DIR="$cargo_target" \
        -DMEMPLUG_SANITIZER_TESTS=OFF >/dev/null
    cmake --build "target/cmake-$cc$opt" >/dev/null
    echo "C side builds warning-free: $cc $opt"
done
phase "C side, every compiler and level"

# The Python package (python/, a cargo workspace of its own): formatting
# and lints, then the abi3 wheel built by maturin into a virtual
# environment under the target directory (maturin, numpy and pytest from
# the package registry) and pytest over it, the example included.
cargo fmt --manifest-path python/Cargo.toml -- --check
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/python" \
    cargo clippy --manifest-path python/Cargo.toml -- -D warnings
scripts/python-test.sh
phase "Python"
