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
count() { # path iterations -> "instructions atomics" in all
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --collect-bus=yes --callgrind-out-file="$out" "$bin" "$1" "$2" "$so" >/dev/null 2>&1
    awk '/^summary:/ {print $2, $3}' "$out"
    rm -f "$out"
}
lo=${LO:-1000} hi=${HI:-11000}
printf '%-28s %12s %10s\n' path instr/op atomics/op
for p in "${paths[@]}"; do
    read -r ai ag < <(count "$p" $lo)
    read -r bi bg < <(count "$p" $hi)
    printf '%-28s %12.1f %10.1f\n' "$p" "$(echo "($bi - $ai) / ($hi - $lo)" | bc -l)" \
        "$(echo "($bg - $ag) / ($hi - $lo)" | bc -l)"
done
