#!/usr/bin/env bash
# Installs the system packages memplug's build and tests need and a fresh
# machine lacks (cmake, ninja, clang/libclang for bindgen, abigail-tools,
# valgrind, pkg-config).
# Idempotent: does nothing when everything is present.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v abidiff >/dev/null || need+=(abigail-tools)
command -v valgrind >/dev/null || need+=(valgrind)
command -v pkg-config >/dev/null || need+=(pkg-config)

if ((${#need[@]})); then
    echo "setup: installing ${need[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
