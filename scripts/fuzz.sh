#!/usr/bin/env bash
# Fuzzing memplug's host (fuzz/README.md).
#
#   scripts/fuzz.sh --bounded          every target on its seed corpus and on
#                                      pseudo-random inputs from a fixed seed,
#                                      on the stable toolchain (part of the
#                                      workspace tests; seconds)
#   scripts/fuzz.sh TARGET [SECONDS]   the long run: cargo-fuzz (libFuzzer +
#                                      AddressSanitizer, nightly) for SECONDS
#                                      (default 300); installs cargo-fuzz if
#                                      missing
#   scripts/fuzz.sh --all [SECONDS]    the long run of every target in turn
#   scripts/fuzz.sh --list             the targets
#
# The long run reads the committed seeds in fuzz/corpus/TARGET/ and writes
# what it discovers to fuzz/work/corpus/TARGET/ (ignored by git); a crash is
# saved under fuzz/artifacts/TARGET/ and replayed with
#   cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...
# (from fuzz/), or on stable with
#   MEMPLUG_FUZZ_REPLAY=fuzz/artifacts/TARGET/crash-... \
#     cargo test -p memplug-fuzz-targets --test bounded replay -- --nocapture
# Extra arguments after SECONDS go to libFuzzer (e.g. -jobs=2 -workers=2).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(plugin_descriptor host_calls)

usage() {
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

long_run() {
    local target=$1 seconds=$2
    shift 2
    local known=0
    for t in "${targets[@]}"; do [[ $t == "$target" ]] && known=1; done
    if [[ $known == 0 ]]; then
        echo "unknown target '$target' (targets: ${targets[*]})" >&2
        exit 2
    fi
    if ! rustup run nightly rustc --version >/dev/null 2>&1; then
        echo "the long run needs a nightly toolchain: rustup toolchain install nightly" >&2
        exit 2
    fi
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "installing cargo-fuzz" >&2
        cargo install cargo-fuzz --locked
    fi
    mkdir -p "fuzz/work/corpus/$target"
    echo "fuzzing $target for ${seconds}s" >&2
    # First corpus directory: where new inputs go; the committed seeds are
    # read only. rss_limit: the host_calls target maps up to a few MiB per
    # input, far below it; a climb means a leak.
    (cd fuzz && cargo +nightly fuzz run "$target" "work/corpus/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 "$@")
}

case "${1:-}" in
    "" | -h | --help) usage 0 ;;
    --list) printf '%s\n' "${targets[@]}" ;;
    --bounded)
        cargo test -p memplug-fuzz-targets --test bounded -- --nocapture
        ;;
    --all)
        seconds=${2:-300}
        shift $(($# < 2 ? $# : 2))
        for t in "${targets[@]}"; do long_run "$t" "$seconds" "$@"; done
        ;;
    -*) usage 2 ;;
    *)
        target=$1
        seconds=${2:-300}
        shift $(($# < 2 ? $# : 2))
        long_run "$target" "$seconds" "$@"
        ;;
esac
