#!/usr/bin/env bash
# Regenerates every file under docs/bench/ (the hand-run measurements of docs/performance.md,
# each script's output with a header: command, date, nproc, server versions, commit):
#   pg-limits.txt              PostgreSQL's own ceilings (scripts/pg-limits.sh; skipped if the
#                              shared reference script is absent)
#   claim-bench.txt            the claim and settle statements alone (scripts/claim-bench/run.sh)
#   write-cost.txt             what each part of the outbox row costs 16 writers (scripts/write-cost.sh)
#   drain-{postgres,mysql,sqlite}-{null,nats}.txt   one relay draining EVENTS events
#                              (scripts/drain.sh, scripts/drain-db.sh)
#   wake-{sqlite,mysql}-*.txt  wake-up latency for a writer in another process (scripts/wake-db.sh)
#   drain-otel-{null,nats}.txt what tracing costs the drain (scripts/drain-otel.sh)
# docs/bench.txt, .json and .svg are scripts/bench.sh's; --with-bench runs it too (about 10
# minutes more). EVENTS (default 50000), WAKES (20) and ROUNDS (3) set the sizes; the defaults
# take about 12 minutes on 2 cores. ONLY="drain wake" runs only the named groups (pg-limits,
# claim, write-cost, drain, wake, otel). Builds the release binaries first (CARGO_TARGET_DIR is honoured).
#   scripts/bench-all.sh
#   EVENTS=100000 scripts/bench-all.sh --with-bench
# Needs the services of scripts/services.sh (PostgreSQL, MySQL/MariaDB, NATS), psql, the
# `mariadb` (or `mysql`) client and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
with_bench=
for a in "$@"; do
  case $a in
    --with-bench) with_bench=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/bench-all.sh: unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done
events=${EVENTS:-50000}
wakes=${WAKES:-20}
rounds=${ROUNDS:-3}
only=${ONLY:-pg-limits claim write-cost drain wake otel}
nats=${NATS_URL:-nats://127.0.0.1:4222}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
cargo build --release -p txoutbox-cli --bin txoutbox
export TXOUTBOX_BIN=${TXOUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/txoutbox}
unset ROUNDS RELAYS
mkdir -p docs/bench
out=docs/bench
want() { [[ " $only " == *" $1 "* ]]; }
step() { echo "== $1" >&2; }
if want pg-limits; then
  step pg-limits; BENCH_OUT=$out/pg-limits.txt scripts/pg-limits.sh 1 8
fi
if want claim; then
  step claim-bench; ROUNDS=2 BENCH_OUT=$out/claim-bench.txt scripts/claim-bench/run.sh
fi
if want write-cost; then
  step write-cost; BENCH_OUT=$out/write-cost.txt scripts/write-cost.sh 3 8
fi
if want drain; then
  for p in "null|null:" "nats|$nats?stream=DRAIN&subject=drain.{aggregate_type}.{event_type}"; do
    name=${p%%|*} url=${p#*|}
    step "drain postgres $name"; BENCH_OUT=$out/drain-postgres-$name.txt scripts/drain.sh "$events" "$url"
    for db in mysql sqlite; do
      step "drain $db $name"; BENCH_OUT=$out/drain-$db-$name.txt scripts/drain-db.sh $db "$events" "$url"
    done
  done
fi
if want wake; then
  step "wake sqlite 1s"; BENCH_OUT=$out/wake-sqlite-1s.txt scripts/wake-db.sh sqlite "$wakes" --poll-interval 1s
  step "wake mysql 1s"; BENCH_OUT=$out/wake-mysql-1s.txt scripts/wake-db.sh mysql "$wakes" --poll-interval 1s
  step "wake mysql 100ms"; BENCH_OUT=$out/wake-mysql-100ms.txt scripts/wake-db.sh mysql "$wakes" --poll-interval 100ms
fi
if want otel; then
  step "drain-otel null"; ROUNDS=$rounds BENCH_OUT=$out/drain-otel-null.txt scripts/drain-otel.sh "$events" null:
  step "drain-otel nats"; ROUNDS=$rounds BENCH_OUT=$out/drain-otel-nats.txt scripts/drain-otel.sh "$events" \
    "$nats?stream=DRAINOTEL&subject=drainotel.{aggregate_type}.{event_type}"
fi
if [ -n "$with_bench" ]; then
  step "scripts/bench.sh"; BIN=$TXOUTBOX_BIN scripts/bench.sh
fi
