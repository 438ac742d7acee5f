#!/usr/bin/env bash
# The counted regression gate (docs/performance.md#the-counted-gate): what draining 20,000
# events costs the database, per event (bytes and round trips between the relay and PostgreSQL,
# WAL written), for each source and mode, against the counts stored in docs/bench/costs.json.
# Counts, not times: the same on a busy machine, so CI runs it. It fails when a count is more
# than the file's threshold over its stored value.
#   scripts/cost-gate.sh                  # check (scripts/test.sh runs this after the tests)
#   scripts/cost-gate.sh --write          # store this tree's counts as the new baseline
# Round trips grow with a slower machine's longer drain (heartbeats and polls the clock paces):
# after --write, consider keeping the larger of the old and new round trips, as the last store
# did (docs/performance.md#the-counted-gate), so the next machine does not fail on its speed.
# The WAL count is the server's: run it alone, not beside other tests.
# Needs the services of scripts/services.sh (PostgreSQL with wal_level = logical).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=docs/bench/costs.json
file=(--check-costs "$baseline")
if [ "${1:-}" = --write ]; then
  shift
  file=(--write-costs "$baseline")   # keeps the threshold the file has
fi
target="${CARGO_TARGET_DIR:-target}"
# The debug build the tests use (a count does not depend on the optimiser).
cargo build -q --workspace --all-features --bins
export DATABASE_URL="${TEST_DATABASE_URL:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}"
export TXOUTBOX_LOG=${TXOUTBOX_LOG:-warn}
"$target/debug/txoutbox-bench" scale --relays 1 --mode ordered,unordered --source table,wal \
  --events 20000 --repeats 1 --publisher null: --txoutbox-bin "$target/debug/txoutbox" \
  "${file[@]}" "$@"
