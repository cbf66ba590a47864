#!/usr/bin/env bash
# GPU check of the memplug CUDA VMM plugin: its tests against the real
# driver, then its benchmarks. Builds nothing and needs no Rust toolchain:
# it runs binaries built on another x86-64 Linux machine, which lie next to
# this script (prepare the folder with plugins/cuda-vmm/pack-device-check.sh
# OUT_DIR on the build machine, copy it over, run ./device-check.sh there):
#
#     libmemplug_plugin_cuda_vmm.so.gz the plugin (debug info stripped)
#     vmm.gz, bench.gz, ...            the plugin's test binaries (stripped):
#                                      driver_loading, sharing, abi_1_2,
#                                      pinned, copy, frees, capture, kit
#     (gzip-compressed, unpacked into a scratch folder when this runs)
#     fake_cuda.c, fake_cuda_*.inc     the fake driver's source (--fake only)
#     PACKED_SIZE                      the folder's size in bytes, as packed
#
#     ./device-check.sh [--fake] [--out DIR]
#
# Output: the full log (every step's whole output) in DIR/device-check.log,
# every figure in DIR/figures.json (machine-readable), the summary in
# DIR/summary.txt; DIR is --out, else $OUT (the device tool's output
# folder), else ./device-check-out. The screen gets one line per step (and
# the tail of a failing step's output), then the one-screen summary, last.
#
# --fake: a dry run on a machine without a GPU: the fake driver is compiled
# from fake_cuda.c (cc) unless MEMPLUG_CUDA_DRIVER names a driver already,
# the benchmarks run tiny (MEMPLUG_CUDA_BENCH_SCALE=tiny unless set), and
# everything is labelled FAKE: no figure of a dry run is a GPU figure.
# DEVICE_CHECK_QUICK=1 runs a few tests of each step only (the plugin's own
# test of this script uses it).
#
# Finishes within DEVICE_CHECK_BUDGET_S seconds (default 480, well inside
# one 10-minute call): each step has its own limit, cut to what is left of
# the budget; a step with under 10 s left is skipped (and counts as
# failed). Exits 0 when every step passed, 1 when one failed, 2 when the
# folder is incomplete.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
fake=0
out="${OUT:-}"
while [ $# -gt 0 ]; do
    case "$1" in
    --fake) fake=1 ;;
    --out)
        out="${2:?--out needs a folder}"
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "unknown argument: $1 (see --help)" >&2
        exit 2
        ;;
    esac
    shift
done
out="${out:-$PWD/device-check-out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/device-check.log"
figures="$out/figures.json"
summary="$out/summary.txt"
: >"$log"
budget="${DEVICE_CHECK_BUDGET_S:-480}"
started=$(date +%s)
status=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
: >"$work/figures"
steps_json=""
export LC_ALL=C

# Prints to the screen and the log.
say() { printf '%s\n' "$*" | tee -a "$log"; }

# A JSON string literal.
json() {
    local s="$1"
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="${s//$'\t'/\\t}"
    s="${s//$'\r'/}"
    s="${s//$'\n'/\\n}"
    printf '"%s"' "$s"
}

# The binaries travel gzip-compressed (pack-device-check.sh: the folder
# stays within 16 MiB) and are unpacked into a scratch folder here; one
# lying uncompressed beside this script is used as it is.
bin="$work/bin"
mkdir -p "$bin"
for f in libmemplug_plugin_cuda_vmm.so vmm bench driver_loading sharing abi_1_2 pinned copy frees capture kit; do
    if [ -e "$here/$f" ]; then
        ln -s "$here/$f" "$bin/$f"
    elif [ -e "$here/$f.gz" ]; then
        if ! gzip -dc "$here/$f.gz" >"$bin/$f"; then
            echo "cannot unpack $here/$f.gz (gzip -d)" >&2
            exit 2
        fi
        chmod +x "$bin/$f"
    else
        echo "missing $here/$f.gz: see the top of this script for how to prepare the folder" >&2
        exit 2
    fi
done

mode=GPU
if [ "$fake" = 1 ]; then
    mode=FAKE
    export MEMPLUG_CUDA_BENCH_SCALE="${MEMPLUG_CUDA_BENCH_SCALE:-tiny}"
    export MEMPLUG_FAKE_CUDA_DEVICES="${MEMPLUG_FAKE_CUDA_DEVICES:-1}"
    if [ -z "${MEMPLUG_CUDA_DRIVER:-}" ]; then
        src="$here/fake_cuda.c"
        [ -f "$src" ] || src="$here/fake-driver/fake_cuda.c"
        if [ ! -f "$src" ]; then
            echo "--fake: no fake_cuda.c beside this script (pack-device-check.sh copies it)" >&2
            exit 2
        fi
        if ! "${CC:-cc}" -std=gnu11 -O1 -shared -fPIC -pthread -fvisibility=hidden -Wl,-soname,libcuda.so.1 \
            "$src" -o "$work/libcuda.so.1" >>"$log" 2>&1; then
            echo "--fake: the fake driver did not compile (see $log)" >&2
            exit 2
        fi
        export MEMPLUG_CUDA_DRIVER="$work/libcuda.so.1"
    fi
    say "DRY RUN on the FAKE driver ($MEMPLUG_CUDA_DRIVER): no figure below is a GPU figure"
elif [ -n "${MEMPLUG_CUDA_DRIVER:-}" ]; then
    say "note: using MEMPLUG_CUDA_DRIVER=$MEMPLUG_CUDA_DRIVER, not the system's driver"
fi
export MEMPLUG_CUDA_PLUGIN="$bin/libmemplug_plugin_cuda_vmm.so"
# The test binaries' real-driver mode (fake-only checks skipped): what runs
# on the GPU, rehearsed on the fake with --fake.
export MEMPLUG_CUDA_TEST_REAL=1
export RUST_BACKTRACE=1

say "== machine"
uname -a | tee -a "$log"
smi=""
if command -v nvidia-smi >/dev/null 2>&1; then
    smi="$(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 || true)"
    printf '%s\n' "$smi" | tee -a "$log"
else
    say "(no nvidia-smi)"
fi

# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in the log.
step() {
    local name="$1" limit="$2"
    shift 2
    local left=$((budget - ($(date +%s) - started)))
    if [ "$left" -lt 10 ]; then
        say "== $name: SKIPPED (${left}s of the ${budget}s budget left)"
        status=1
        steps_json="$steps_json${steps_json:+,}{\"name\":$(json "$name"),\"exit\":null,\"seconds\":0,\"skipped\":true}"
        return
    fi
    [ "$limit" -gt "$left" ] && limit="$left"
    say "== $name (limit ${limit}s)"
    local t0 rc dt
    t0=$(date +%s)
    timeout --signal=KILL "$limit" "$@" >"$work/step.out" 2>&1
    rc=$?
    last_rc=$rc
    dt=$(($(date +%s) - t0))
    cat "$work/step.out" >>"$log"
    grep -o 'FIGURE {.*}' "$work/step.out" | sed 's/^FIGURE //' >>"$work/figures"
    grep -o 'INFO {.*}' "$work/step.out" | sed 's/^INFO //' >>"$work/info"
    if [ "$rc" -ne 0 ]; then
        status=1
        [ "$rc" -eq 137 ] && say "   (killed at its time limit)"
        say "   last lines of its output (all of it is in $log):"
        tail -n 15 "$work/step.out" | sed 's/^/   | /'
    fi
    say "-- $name: exit $rc after ${dt}s"
    steps_json="$steps_json${steps_json:+,}{\"name\":$(json "$name"),\"exit\":$rc,\"seconds\":$dt}"
}

quick="${DEVICE_CHECK_QUICK:-0}"
functional=(--test-threads=1)
discovery=(--test-threads=1 --skip the_library_exports_only_the_entry_symbol)
benches=(--ignored --nocapture --test-threads=1 --skip gpu_driver_info)
copies=(--test-threads=1)
frees=(--test-threads=1)
capture=(--test-threads=1)
if [ "$quick" = 1 ]; then
    copies+=(--exact copies_with_pageable_memory_return_while_the_stream_is_held)
    frees+=(--exact a_free_while_a_stream_is_blocked_does_not_block)
    capture+=(--exact work_on_a_capturing_stream_is_refused_and_the_capture_survives)
    functional+=(--exact one_mechanism_per_device_with_every_capability fences_complete_after_the_work_before_them)
    discovery=(--test-threads=1 --exact no_driver_at_all_is_device_unavailable_with_a_message)
    benches+=(--exact gpu_bench_shared_prefix)
fi

# Which driver, which version (cuDriverGetVersion), which devices.
step "driver" 60 "$bin/bench" --ignored --exact gpu_driver_info --nocapture --test-threads=1
# The functional tests on the real driver (one at a time: they count live
# objects per process).
step "functional tests" 150 "$bin/vmm" "${functional[@]}"
# Driver discovery: the scenarios that need no compiler (the others skip
# themselves with MEMPLUG_CUDA_TEST_REAL=1); nm may be missing here.
step "driver discovery" 60 "$bin/driver_loading" "${discovery[@]}"
# ABI 1.2 on the device: descriptor, identity, the fill skipped on the
# hint, peer access (with two devices), stream_wait_fence, typed adoption.
step "abi 1.2" 60 "$bin/abi_1_2" --test-threads=1
# Export and import of shareable handles, one process and two (the test
# binary re-run as the child, the descriptor passed over SCM_RIGHTS).
last_rc=
step "sharing" 90 "$bin/sharing" --test-threads=1
case "$last_rc" in
0) export_note="passed: tests/sharing.rs two_processes_share_one_exportable_object_over_scm_rights and the in-process export/import tests ($mode driver)" ;;
"") export_note="not run: the budget ran out" ;;
*) export_note="FAILED (exit $last_rc): see the sharing step in the log" ;;
esac
# Pinned host memory (cuda<N>-host): cuMemHostAlloc blocks written by the
# CPU, copied to device memory and back on both mechanisms' streams.
step "pinned host memory" 60 "$bin/pinned" --test-threads=1
# What only a real driver can confirm (issue 30): copies with pageable
# memory return without waiting, frees never wait for the device, graph
# capture refused and not broken by allocations.
step "copies" 60 "$bin/copy" "${copies[@]}"
step "frees" 60 "$bin/frees" "${frees[@]}"
step "graph capture" 60 "$bin/capture" "${capture[@]}"
# The benchmarks, full size on a GPU.
step "benchmarks" 240 "$bin/bench" "${benches[@]}"
# The conformance kit (the checks of `memplug conformance`, through its
# library) on every mechanism of the plugin: cuda<N>-vmm and cuda<N>-host
# of every device. Last: what is left of the budget.
step "conformance kit" 150 "$bin/kit" --test-threads=1 --nocapture

elapsed=$(($(date +%s) - started))
libcuda="$(grep -o 'libcuda: .*' "$log" | head -n 1 | sed 's/^libcuda: //')"
version="$(grep -o 'cuDriverGetVersion: .*' "$log" | head -n 1 | sed 's/^cuDriverGetVersion: //')"
devices="$(grep -E '^device [0-9]+: ' "$log" | sed 's/^/  /')"
packed="$(cat "$here/PACKED_SIZE" 2>/dev/null || true)"
info="$(head -n 1 "$work/info" 2>/dev/null || true)"

# The figures file.
{
    printf '{\n  "mode": %s,\n' "$(json "$mode")"
    printf '  "date": %s,\n' "$(json "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
    printf '  "machine": %s,\n' "$(json "$(uname -a)")"
    printf '  "nvidia_smi": %s,\n' "$([ -n "$smi" ] && json "$smi" || echo null)"
    printf '  "driver": %s,\n' "${info:-null}"
    printf '  "packed_bytes": %s,\n' "${packed:-null}"
    printf '  "budget_s": %s,\n  "elapsed_s": %s,\n  "passed": %s,\n' "$budget" "$elapsed" \
        "$([ "$status" -eq 0 ] && echo true || echo false)"
    printf '  "steps": [%s],\n' "$steps_json"
    printf '  "figures": [\n'
    sed 's/^/    /; s/$/,/' "$work/figures"
    printf '    {"name":"export_import_two_processes","value":null,"unit":null,"driver":%s,"note":%s}\n' \
        "$(json "$mode")" "$(json "$export_note")"
    printf '  ]\n}\n'
} >"$figures"

# The value of figure NAME, formatted with FMT (n/a when absent).
fig() {
    local v
    v="$(grep -F "\"name\":\"$1\"" "$work/figures" | tail -n 1 | sed 's/.*"value":\([^,]*\),.*/\1/')"
    if [ -z "$v" ] || [ "$v" = null ]; then
        printf 'n/a'
    else
        printf "${2:-%.2f}" "$v"
    fi
}

{
    echo "== summary: $([ "$mode" = FAKE ] && echo 'FAKE driver (dry run, not a GPU: no figure here is a GPU figure)' || echo 'GPU')"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   budget ${budget}s, took ${elapsed}s"
    [ -n "$smi" ] && echo "nvidia-smi: $smi"
    echo "libcuda: ${libcuda:-(unknown: the driver step failed)}"
    echo "cuDriverGetVersion: ${version:-(unknown)}"
    [ -n "$devices" ] && printf '%s\n' "$devices"
    [ -n "$packed" ] && echo "packed folder: $(awk "BEGIN { printf \"%.1f\", $packed / 1048576 }") MiB"
    printf 'steps:'
    printf '%s' "$steps_json" | grep -o '"name":"[^"]*","exit":[^,]*' |
        sed 's/"name":"\([^"]*\)","exit":\(.*\)/ \1=\2/' | tr -d '\n'
    echo
    echo "figures [$mode]:"
    echo "  1-granule commit+decommit: host $(fig granule_commit_decommit_host_us) us | raw $(fig granule_commit_decommit_raw_us) us (x$(fig granule_host_over_raw %.3f)) | raw+zero-fill $(fig granule_commit_decommit_raw_zero_fill_us) us (x$(fig granule_host_over_raw_zero_fill %.3f); target <= 1.05)"
    echo "  commit latency: idle p50 $(fig commit_latency_idle_p50_us %.1f) us p99 $(fig commit_latency_idle_p99_us %.1f) us | 2nd stream busy p50 $(fig commit_latency_busy_p50_us %.1f) us p99 $(fig commit_latency_busy_p99_us %.1f) us"
    echo "  KV growth to $(fig kv_growth_target_gib) GiB: stable address $(fig kv_growth_vmm_ms %.1f) ms, peak $(fig kv_growth_vmm_peak_gib %.3f) GiB | doubling+copy $(fig kv_growth_copy_ms %.1f) ms, peak $(fig kv_growth_copy_peak_gib %.3f) GiB"
    echo "  shared prefix: $(fig shared_prefix_regions %.0f) regions x $(fig shared_prefix_gib %.3f) GiB prefix: $(fig shared_prefix_used_gib %.3f) GiB used (cuMemGetInfo)"
    echo "  export/import across two processes: $export_note"
    echo "full log: $log"
    echo "figures: $figures"
    echo "result: $([ "$status" -eq 0 ] && echo 'ALL STEPS PASSED' || echo 'SOME STEPS FAILED')"
} >"$summary"
echo
cat "$summary"
cat "$summary" >>"$log"
exit "$status"
