#!/usr/bin/env bash
# The full benchmark behind docs/performance.md, on a release build: each
# publisher alone (publish), drain (null: and NATS JetStream), latency at 500 and 5,000
# events/s, the write path with 16 writers, and scale (1, 2, 4 relays, ordered and
# unordered), 3 interleaved runs each.
# Writes docs/bench.json, docs/bench.svg and docs/bench.txt (the table). The other
# measurements of docs/performance.md (docs/bench/*.txt) are scripts/bench-all.sh's.
#   scripts/bench.sh                  # everything (about 10 minutes on 2 cores)
#   EVENTS=1000000 scripts/bench.sh   # other sizes: EVENTS, DURATION, REPEATS, WRITERS; BIN
#   SOURCE=table,wal scripts/bench.sh # the table relay beside relay --source wal (twice as long)
#   scripts/bench.sh --relay-arg=--retention-period=0   # extra arguments go to txoutbox-bench
# Needs the services of scripts/services.sh (PostgreSQL; NATS for the broker reference).
# The bench is its own binary (crates/txoutbox-bench; `txoutbox-bench --help`); its relays are
# `txoutbox relay` child processes.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export TXOUTBOX_LOG=${TXOUTBOX_LOG:-warn}
nats=${NATS_URL:-nats://127.0.0.1:4222}
events=${EVENTS:-100000}
duration=${DURATION:-10s}
repeats=${REPEATS:-3}
writers=${WRITERS:-16}
source=${SOURCE:-table}
# BIN=path/to/txoutbox runs the relays with that binary instead of building one (the bench
# itself is built either way).
release="${CARGO_TARGET_DIR:-target}/release"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p txoutbox-cli --bin txoutbox
  cargo build --release -p txoutbox-bench
else
  cargo build --release -p txoutbox-bench
fi
export TXOUTBOX_BIN=${BIN:-$release/txoutbox}
mkdir -p docs
"$release/txoutbox-bench" all \
  --events "$events" --duration "$duration" --repeats "$repeats" --writers "$writers" \
  --source "$source" \
  --publisher null: \
  --publisher "$nats?stream=DRAIN&subject=drain.{aggregate_type}.{event_type}" \
  --rate 500,5000 --relays 1,2,4 --mode ordered,unordered \
  --json-file docs/bench.json --chart docs/bench.svg "$@" | tee docs/bench.txt
