#!/usr/bin/env bash
# GPU check of the memplug CUDA VMM plugin: its tests against the real
# driver, then its benchmarks, printing every figure. Builds nothing and
# needs no Rust toolchain: it runs binaries built on another x86-64 Linux
# machine, which must lie next to this script:
#
#     libmemplug_plugin_cuda_vmm.so    the plugin
#     vmm, bench, driver_loading       the plugin's test binaries
#
# Prepare them on the build machine with
#     plugins/cuda-vmm/pack-device-check.sh OUT_DIR
# (which runs `cargo test --release -p memplug-plugin-cuda-vmm --tests
# --no-run` and copies target/release/deps/{vmm,bench,driver_loading}-HASH
# under those names, and target/release/deps/libmemplug_plugin_cuda_vmm.so),
# copy OUT_DIR to the GPU machine and run ./device-check.sh there.
#
# Finishes within 8 minutes (each step has its own time limit); exits
# non-zero if any step failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export MEMPLUG_CUDA_PLUGIN="$here/libmemplug_plugin_cuda_vmm.so"
export MEMPLUG_CUDA_TEST_REAL=1
export RUST_BACKTRACE=1
# The system's driver, unless MEMPLUG_CUDA_DRIVER names another one (a
# driver in an unusual place, or the fake, to rehearse this script without
# a GPU together with MEMPLUG_CUDA_BENCH_SCALE=tiny).
if [ -n "${MEMPLUG_CUDA_DRIVER:-}" ]; then
    echo "note: using MEMPLUG_CUDA_DRIVER=$MEMPLUG_CUDA_DRIVER, not the system's driver"
fi
started=$(date +%s)
status=0
log="$(mktemp)"

for f in libmemplug_plugin_cuda_vmm.so vmm bench driver_loading; do
    if [ ! -e "$here/$f" ]; then
        echo "missing $here/$f: see the top of this script for how to prepare the folder" >&2
        exit 2
    fi
done

echo "== machine"
uname -a
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || true
else
    echo "(no nvidia-smi)"
fi

step() {
    local name="$1" limit="$2"
    shift 2
    echo
    echo "== $name (limit ${limit}s)"
    local t0=$(date +%s)
    timeout --signal=KILL "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "-- $name: exit $rc after $(( $(date +%s) - t0 ))s"
    if [ "$rc" -ne 0 ]; then
        status=1
    fi
}

# The functional tests on the real driver (one at a time: they count live
# objects per process).
step "functional tests (real driver)" 150 "$here/vmm" --test-threads=1
# Driver discovery: the scenarios that need no compiler (the others skip
# themselves with MEMPLUG_CUDA_TEST_REAL=1); nm may be missing here.
step "driver discovery" 60 "$here/driver_loading" --test-threads=1 --skip the_library_exports_only_the_entry_symbol
# The benchmarks, full size.
step "benchmarks" 240 "$here/bench" --ignored --nocapture --test-threads=1

echo
echo "== figures"
grep -o 'BENCH.*' "$log" || echo "(no benchmark figure was printed)"
rm -f "$log"
echo
echo "== done in $(( $(date +%s) - started ))s: $([ "$status" -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
exit "$status"
