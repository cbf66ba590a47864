#!/usr/bin/env bash
# Installs the Debian packages a fresh machine lacks for one job:
#
#   scripts/setup.sh run    the main job (scripts/run.sh): a C toolchain for
#                           cargo to link with (gcc, libc6-dev); nothing else
#   scripts/setup.sh test   every test (scripts/test.sh): the above, g++,
#                           cmake, ninja, clang and libclang (bindgen),
#                           abigail-tools (abidiff), valgrind, pkg-config,
#                           UCX (libucx-dev: libucp.so.0 and the headers
#                           memplug-ucx's layout test compiles against;
#                           ucx-utils: ucx_perftest for its benchmark)
#
# Idempotent: installs only what is missing (apt-get, as root or via sudo).
# The Rust toolchain itself (cargo) is not installed here.
set -euo pipefail

job="${1:-}"
case "$job" in
    run | test) ;;
    *)
        echo "usage: scripts/setup.sh run|test" >&2
        exit 2
        ;;
esac

need=()
# want COMMAND PACKAGE: PACKAGE when COMMAND is missing.
want() { command -v "$1" >/dev/null || need+=("$2"); }

want cc gcc
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
if [ "$job" = test ]; then
    want c++ g++
    want cmake cmake
    want ninja ninja-build
    want clang clang
    ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
    want abidiff abigail-tools
    want valgrind valgrind
    want pkg-config pkg-config
    # memplug-ucx opens libucp.so.0 at run time and skips its tests without
    # it; installed here so the test run exercises it.
    [ -e /usr/include/ucp/api/ucp.h ] || need+=(libucx-dev)
    want ucx_perftest ucx-utils
fi

if ((${#need[@]})); then
    echo "setup ($job): installing ${need[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
