#!/usr/bin/env bash
# PostgreSQL's side of a drain, measured in PL/pgSQL loops (no relay, no network): the row-lease
# claim (UPDATE) + settle, against the read-only ordered claim + settle (UPDATE, or DELETE with
# retention 0). Each loop drains 100k events, 500 per claim; the three alternate ROUNDS times
# (default 2), so compare them within a run. Needs psql; DATABASE_URL defaults to the local test
# database. Drops its schema "exp" at the end.
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/../bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
ROUNDS="${ROUNDS:-2}"
run() {
  psql -q "$URL" -f setup.sql 2>/dev/null
  psql -q "$URL" -f loops.sql
  psql "$URL" -c "$1" 2>&1 | sed -n 's/^NOTICE:  //p'
}
for _ in $(seq 1 "$ROUNDS"); do
  run "CALL exp.run_a(500)"
  run "CALL exp.run_b(500, false)"
  run "CALL exp.run_b(500, true)"
done
psql -q "$URL" -c "SET client_min_messages = warning; DROP SCHEMA exp CASCADE"
