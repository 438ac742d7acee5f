#!/usr/bin/env bash
# PostgreSQL's own ceilings for outbox work on this machine, with pgbench alone and no txoutbox:
# the write path (commits/s of a business insert, with an outbox row, with a NOTIFY trigger per
# row or per statement) and the set-based claim-and-acknowledge ceiling (rows/s, UPDATE or
# DELETE). The denominator of a drain's ratio: run it in the same session as the benchmark.
# It runs the shared reference script bench/pg-limits/run.sh beside this repository (not part
# of it; PG_LIMITS=path/to/run.sh names another copy); if that is absent this says so and skips.
# Arguments go to it: RUNS (default here 1) and SECONDS per write-path point (default 8);
# SKIP_A=1 or SKIP_B=1 skip a section. About 2 minutes with the defaults here on 2 cores.
#   scripts/pg-limits.sh
#   BENCH_OUT=docs/bench/pg-limits.txt scripts/pg-limits.sh 1 8
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
ref=${PG_LIMITS:-$(dirname "$0")/../../shared/bench/pg-limits/run.sh}
if [ ! -x "$ref" ]; then
  echo "pg-limits: $ref not found: skipped (set PG_LIMITS to the reference run.sh)" >&2
  exit 0
fi
bench_record "$0" "${1:-1}" "${2:-8}"
# Its OUT is a directory for its raw results; never one of ours.
unset OUT
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
hostport=${url#*@}; hostport=${hostport%%/*}
PGHOST=${PGHOST:-${hostport%%:*}} "$ref" "${1:-1}" "${2:-8}"
