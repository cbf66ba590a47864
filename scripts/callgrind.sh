#!/usr/bin/env bash
# Instructions per operation of each hot path, counted by callgrind (exact,
# immune to machine noise), and the locked read-modify-write instructions
# (atomics) among them: callgrind's "global bus events" (--collect-bus).
# Each path runs at two iteration counts; the difference divided by the
# extra iterations cancels all set-up cost.
#   scripts/callgrind.sh [PATH...]     (default: every path)
# LO and HI (default 1000 and 11000) set the two iteration counts, for paths
# too slow under callgrind at the defaults. Uses the release build under
# ${CARGO_TARGET_DIR:-target}; NO_BUILD=1 measures what is built there
# without building first (while another cargo holds the target dir).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${NO_BUILD:-} ]] || cargo build --release -q -p memplug-plugin-cpu -p memplug-host --example hotpath
t=${CARGO_TARGET_DIR:-target}/release
so=$(ls "$t"/libmemplug_plugin_cpu.so "$t"/deps/libmemplug_plugin_cpu.so 2>/dev/null | head -1 || true)
bin=$t/examples/hotpath
paths=("$@")
((${#paths[@]})) || paths=($("$bin" --list))
# shellcheck source=scripts/callgrind-per-op.sh
. scripts/callgrind-per-op.sh
cmd() { CMD=("$bin" "$1" "$2" "$so"); }
per_op path "${paths[@]}"
