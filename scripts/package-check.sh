#!/usr/bin/env bash
# The crates meant for crates.io (every workspace member without
# `publish = false`) package, and build from their packages: `cargo
# package` of them all at once verifies each against the others' packages
# (a temporary local registry), offline, so nothing has to be on crates.io
# first. Each package must hold both license texts and a README.
set -euo pipefail
cd "$(dirname "$0")/.."

members=$(sed -n 's/^members = \[\(.*\)\]$/\1/p' Cargo.toml | tr -d '",')
[ -n "$members" ] || { echo "package-check: no members = [...] line in Cargo.toml" >&2; exit 1; }
published=()
for m in $members; do
    grep -q '^publish = false$' "$m/Cargo.toml" && continue
    published+=("$(sed -n 's/^name = "\(.*\)"$/\1/p' "$m/Cargo.toml" | head -n1)")
done
echo "package-check: publishable: ${published[*]}"

# A target directory of its own: cargo verifies each package in the
# workspace's target directory, where a verified crate can take the file
# names of the workspace's own build (same name and version), built
# against the packaged dependencies; later builds then mix the two.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/package-check"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
# Cargo unpacks the temporary registry's packages under CARGO_HOME, in a
# folder named after the registry's path (`registry/src/-<hash>`), and
# reuses a folder that is already there: a second run from the same path
# (a checkout made again in the same place) would verify against the
# sources of the first. Those folders hold only our own packages.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
for p in "${published[@]}"; do
    rm -rf "$cargo_home"/registry/src/-*/"$p-$version"
done
args=()
for p in "${published[@]}"; do args+=(-p "$p"); done
# --allow-dirty: what is checked is the manifests and files, not git state.
cargo package --offline --allow-dirty "${args[@]}"

out="${CARGO_TARGET_DIR:-target}/package"
fail=0
for p in "${published[@]}"; do
    crate="$out/$p-$version.crate"
    files=$(tar -tzf "$crate")
    for f in LICENSE-APACHE LICENSE-MIT README.md; do
        if ! grep -qx "$p-$version/$f" <<<"$files"; then
            echo "package-check: $crate lacks $f" >&2
            fail=1
        fi
    done
done
exit $fail
