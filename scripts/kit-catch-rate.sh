#!/usr/bin/env bash
# Runs `memplug conformance --json PLUGIN` RUNS times and counts, per run,
# whether a concurrency.* check did not pass (failed, crashed or timed
# out): how often the kit catches a thread-unsafe plugin, or (on a correct
# plugin) how often it blames one wrongly. Prints one line per run and a
# total; exit status 0.
#
#   scripts/kit-catch-rate.sh PLUGIN [RUNS]        (RUNS: 100)
#
# MEMPLUG (default: memplug on PATH) names the command. Needs python3.
set -euo pipefail
plugin="${1:?usage: scripts/kit-catch-rate.sh PLUGIN [RUNS]}"
runs="${2:-100}"
memplug="${MEMPLUG:-memplug}"
caught=0
start=$(date +%s)
for i in $(seq 1 "$runs"); do
    verdict=$({ "$memplug" conformance --json "$plugin" 2>/dev/null || true; } | python3 -c '
import json, sys
r = json.load(sys.stdin)
bad = [c["name"] + ":" + c["outcome"] for c in r["checks"]
       if c["name"].startswith("concurrency.") and c["outcome"] not in ("pass", "skip")]
# A run that caught nothing prints "-" and what the allocator storm did.
alloc = [c["detail"].split("; ")[-1] for c in r["checks"] if c["name"] == "concurrency.allocator"]
print(" ".join(bad) if bad else "- (" + ", ".join(alloc) + ")")' || echo "no-report")
    if [ "${verdict:0:1}" != "-" ]; then
        caught=$((caught + 1))
    fi
    echo "run $i: $verdict"
done
echo "caught in $caught of $runs runs ($(( $(date +%s) - start )) s)"
