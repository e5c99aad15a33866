#!/usr/bin/env bash
# `make test`'s runner: every unit, doc and integration test of the workspace, in two lanes at
# once. Most tests wait on a real nats-server (timeouts, elections, killed processes) rather than
# compute, so a 2-core machine runs the five longest integration binaries (the slow lane, its
# output printed when it ends) beside all the others, four tests at a time in each binary.
# Every test target runs in one lane or the other: the slow lane is named here, the other lane
# is every other test target of every workspace package, read from `cargo metadata`. Every
# cargo command selects `--workspace`, so all of them use the crates as built once.
set -euo pipefail
cd "$(dirname "$0")/.."

slow=(reliability bad_input service_faults exactly_once raw_faults)
threads=(-- --test-threads=4)

cargo test --workspace --locked --no-run

rest=$(cargo metadata --locked --format-version 1 --no-deps | python3 -c '
import json, sys
slow = set(sys.argv[1:])
meta = json.load(sys.stdin)
names = sorted({t["name"] for p in meta["packages"] for t in p["targets"] if "test" in t["kind"]})
missing = slow - set(names)
if missing:
    sys.exit(f"tests/lanes.sh names test targets that do not exist: {sorted(missing)}")
print(" ".join(f"--test={n}" for n in names if n not in slow))
' "${slow[@]}")

log=$(mktemp)
lane=""
# The slow lane runs in a process group of its own; it is stopped with this script however
# this script stops, so nothing is left running.
trap '[ -n "$lane" ] && kill -- -"$lane" 2>/dev/null; rm -f "$log"' EXIT
setsid cargo test --workspace --locked --no-fail-fast "${slow[@]/#/--test=}" "${threads[@]}" \
    >"$log" 2>&1 &
lane=$!

status=0
# shellcheck disable=SC2086 # one word per flag
cargo test --workspace --locked --no-fail-fast --lib --bins --examples $rest "${threads[@]}" \
    || status=$?
cargo test --workspace --locked --no-fail-fast --doc || status=$?

slow_status=0
wait "$lane" || slow_status=$?
lane=""
echo "--- the slow lane: ${slow[*]}"
cat "$log"
if [ "$slow_status" -ne 0 ]; then
    status=$slow_status
fi
exit "$status"
