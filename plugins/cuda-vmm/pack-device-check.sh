#!/usr/bin/env bash
# Builds what device-check.sh runs and puts it in one folder, to be copied
# to a machine with an NVIDIA GPU (x86-64 Linux; no Rust toolchain needed
# there). Run on the build machine, from anywhere:
#
#     plugins/cuda-vmm/pack-device-check.sh [OUT_DIR]   # default target/cuda-device-check
#
# The folder then holds:
#     device-check.sh                  the runner
#     libmemplug_plugin_cuda_vmm.so    the plugin (release build)
#     vmm, bench, driver_loading       the test binaries (release build)
# Copy the whole folder and run ./device-check.sh there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/target/cuda-device-check}"
cd "$root"
mkdir -p "$out"
# `cargo test --no-run` builds the test binaries and, with them, the
# plugin's cdylib (target/release/deps/libmemplug_plugin_cuda_vmm.so).
json="$(cargo test --release -p memplug-plugin-cuda-vmm --tests --no-run --message-format=json)"
for name in vmm bench driver_loading; do
    exe="$(printf '%s\n' "$json" | grep -o "\"executable\":\"[^\"]*/deps/$name-[0-9a-f]*\"" | tail -n 1 |
        sed 's/^"executable":"//; s/"$//')"
    [ -n "$exe" ] || { echo "no test binary named $name was built" >&2; exit 1; }
    cp "$exe" "$out/$name"
done
cp target/release/deps/libmemplug_plugin_cuda_vmm.so "$out/"
cp "$here/device-check.sh" "$out/"
chmod +x "$out/device-check.sh"
ls -la "$out"
