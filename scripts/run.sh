#!/usr/bin/env bash
# The main job: builds memplug and runs its demo: a scripted LLM-serving
# scenario on the reference CPU plugin under a hard budget (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run
cargo build --release -p memplug-plugin-cpu -p memplug-cli
exec "${CARGO_TARGET_DIR:-target}/release/memplug" demo "$@"
