#!/usr/bin/env bash
# Builds what device-check.sh runs and puts it in one folder, to be copied
# to a machine with an NVIDIA GPU (x86-64 Linux; no Rust toolchain needed
# there). Run on the build machine, from anywhere:
#
#     plugins/cuda-vmm/pack-device-check.sh [OUT_DIR]   # default target/cuda-device-check
#
# The folder then holds:
#     device-check.sh                  the runner
#     libmemplug_plugin_cuda_vmm.so.gz the plugin (release build)
#     vmm.gz, bench.gz, ...            the test binaries (release build):
#                                      driver_loading, sharing, abi_1_2,
#                                      pinned, copy, frees, capture, kit
#     (each gzip-compressed: eleven Rust test binaries of ~2 MiB each would
#     not fit 16 MiB; device-check.sh unpacks them)
#     fake_cuda.c, fake_cuda_*.inc     the fake driver's source (device-check.sh --fake)
#     PACKED_SIZE                      the folder's size in bytes
# Copy the whole folder and run ./device-check.sh there (or rehearse it
# here with ./device-check.sh --fake).
#
# The paths come from cargo's artifact messages (--message-format=json), not
# from guesses under target/; the binaries and the plugin are copied with
# their debug info stripped (strip --strip-debug, else objcopy; symbols stay,
# so backtraces still name functions): the folder must travel within a
# 64 MiB limit, and aims at 16 MiB. The size is printed, and a folder over
# 16 MiB is a warning.
#
# PACK_CARGO_JSON=FILE reads the artifact messages from FILE instead of
# building (the plugin's test of this script uses it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/cuda-device-check}"
aim=$((16 << 20))
if [ -n "${PACK_CARGO_JSON:-}" ]; then
    json="$(cat "$PACK_CARGO_JSON")"
else
    # `cargo test --no-run` builds the test binaries and, with them, the
    # plugin's cdylib.
    json="$(cd "$root" && cargo test --release -p memplug-plugin-cuda-vmm --tests --no-run --message-format=json)"
fi
artifacts="$(printf '%s\n' "$json" | grep -F '"reason":"compiler-artifact"' || true)"

# The executable of the test target NAME.
test_exe() {
    printf '%s\n' "$artifacts" | grep -F "\"name\":\"$1\"" | grep -F '"test"' |
        grep -o '"executable":"[^"]*"' | tail -n 1 | sed 's/^"executable":"//; s/"$//'
}
# The plugin's shared library.
plugin_so() {
    printf '%s\n' "$artifacts" | grep -F '"name":"memplug_plugin_cuda_vmm"' | grep -F '"cdylib"' |
        grep -o '"[^"]*/libmemplug_plugin_cuda_vmm\.so"' | tail -n 1 | tr -d '"'
}

# Copies $1 to $2 without debug info.
copy_stripped() {
    if command -v strip >/dev/null 2>&1; then
        strip --strip-debug -o "$2" "$1"
    elif command -v objcopy >/dev/null 2>&1; then
        objcopy --strip-debug "$1" "$2"
    else
        echo "warning: neither strip nor objcopy found: $1 copied with its debug info" >&2
        cp "$1" "$2"
    fi
    chmod +x "$2"
}

mkdir -p "$out"
for name in vmm bench driver_loading sharing abi_1_2 pinned copy frees capture kit; do
    exe="$(test_exe "$name")"
    [ -n "$exe" ] && [ -f "$exe" ] || {
        echo "cargo reported no test binary named $name" >&2
        exit 1
    }
    copy_stripped "$exe" "$out/$name"
    gzip -9 -n -f "$out/$name"
done
so="$(plugin_so)"
[ -n "$so" ] && [ -f "$so" ] || {
    echo "cargo reported no libmemplug_plugin_cuda_vmm.so" >&2
    exit 1
}
copy_stripped "$so" "$out/libmemplug_plugin_cuda_vmm.so"
gzip -9 -n -f "$out/libmemplug_plugin_cuda_vmm.so"
cp "$here/device-check.sh" "$out/"
chmod +x "$out/device-check.sh"
cp "$here/fake-driver/fake_cuda.c" "$here"/fake-driver/fake_cuda_*.inc "$out/"
rm -f "$out/PACKED_SIZE"
size="$(du -sb "$out" | cut -f1)"
printf '%s\n' "$size" >"$out/PACKED_SIZE"
ls -la "$out"
mib="$(awk "BEGIN { printf \"%.1f\", $size / 1048576 }")"
echo "packed: $out, $size bytes ($mib MiB)"
if [ "$size" -gt "$aim" ]; then
    echo "warning: the folder is over the 16 MiB aim ($mib MiB)" >&2
fi
