#!/usr/bin/env bash
# The main job: builds memplug and inspects the reference CPU plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p memplug-plugin-cpu -p memplug-cli
exec target/release/memplug inspect "$@"
