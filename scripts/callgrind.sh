#!/usr/bin/env bash
# Instructions per operation of each hot path, counted by callgrind (exact,
# immune to machine noise). Each path runs at two iteration counts; the
# difference divided by the extra iterations cancels all set-up cost.
#   scripts/callgrind.sh [PATH...]     (default: every path)
# LO and HI (default 1000 and 11000) set the two iteration counts, for paths
# too slow under callgrind at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p memplug-plugin-cpu -p memplug-host --example hotpath
target="${CARGO_TARGET_DIR:-target}"
so=$(ls "$target"/release/libmemplug_plugin_cpu.so "$target"/release/deps/libmemplug_plugin_cpu.so 2>/dev/null | head -1 || true)
bin="$target"/release/examples/hotpath
paths=("$@")
((${#paths[@]})) || paths=($("$bin" --list))
count() { # path iterations -> total instructions
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" "$2" "$so" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
lo=${LO:-1000} hi=${HI:-11000}
printf '%-28s %12s\n' path instr/op
for p in "${paths[@]}"; do
    a=$(count "$p" $lo)
    b=$(count "$p" $hi)
    printf '%-28s %12.1f\n' "$p" "$(echo "($b - $a) / ($hi - $lo)" | bc -l)"
done
