#!/usr/bin/env bash
# Instructions per allocate + free pair through the C API and through the
# Rust bindings it wraps (capi/benches/capi.rs, its --loop mode), counted by
# callgrind (exact, immune to machine noise), and the locked
# read-modify-write instructions (atomics) among them: callgrind's "global
# bus events" (--collect-bus). Each loop runs at two iteration counts; the
# difference divided by the extra iterations cancels all set-up cost.
#   scripts/callgrind-capi.sh [LOOP...]   (default: rust c rust-fenced
#                                          c-fenced rust-cached c-cached)
# LO and HI (default 1000 and 11000) set the two iteration counts. Builds
# the bench (release profile) under ${CARGO_TARGET_DIR:-target}; NO_BUILD=1
# measures without building first (while another cargo holds the target
# dir): the binary BENCH names, else the newest release/deps/capi-* (a
# `cargo test --release` of capi/tests/capi.rs makes one of that name too:
# name the bench with BENCH then).
set -euo pipefail
cd "$(dirname "$0")/.."
t=${CARGO_TARGET_DIR:-target}/release
if [[ -z ${NO_BUILD:-} ]]; then
    # cargo prints the bench binary: "Executable benches/capi.rs (PATH)".
    bin=$(cargo bench -p memplug-host-capi --bench capi --no-run 2>&1 |
        sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
else
    bin=${BENCH:-$(ls -t "$t"/deps/capi-* 2>/dev/null | grep -v '\.d$' | head -1 || true)}
fi
[[ -x ${bin:-} ]] || { echo "no capi bench binary found" >&2; exit 1; }
loops=("$@")
((${#loops[@]})) || loops=(rust c rust-fenced c-fenced rust-cached c-cached)
# shellcheck source=scripts/callgrind-per-op.sh
. scripts/callgrind-per-op.sh
cmd() { CMD=("$bin" --loop "$1" "$2"); }
per_op loop "${loops[@]}"
