#!/usr/bin/env bash
# Drain rate of the release relay: N events inserted set-based into a fresh schema, then
# `txoutbox relay --drain` to PUBLISHER, timed from start to exit (of the last relay, with
# RELAYS=N relays side by side). Extra arguments go to the relay (e.g. --mode unordered).
#   scripts/drain.sh 100000 'nats://127.0.0.1:4222?stream=DRAIN&subject=drain.{aggregate_type}.{event_type}'
# Needs a release build (cargo build --release) and the services of scripts/services.sh.
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
# TXOUTBOX_BIN names the relay binary (default: the release build of CARGO_TARGET_DIR or target).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/drain.sh N PUBLISHER [relay options]}
publisher=${2:?usage: scripts/drain.sh N PUBLISHER [relay options]}
shift 2
bin=${TXOUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/txoutbox}
db=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
schema=txo_drain_$$
export DATABASE_URL=$db TXOUTBOX_SCHEMA=$schema TXOUTBOX_LOG=warn
trap 'psql -q "$db" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1' EXIT
"$bin" migrate >/dev/null
psql -q "$db" -c "INSERT INTO $schema.outbox_events (aggregate_type, aggregate_id, event_type, payload)
  SELECT 'order', (g % 1000)::text, 'order.created',
         jsonb_build_object('order_id', g, 'customer_id', 'c-' || (g % 97), 'total', g * 1.5, 'note', repeat('x', 100))
  FROM generate_series(1, $n) g" >/dev/null
psql -q "$db" -c "VACUUM ANALYZE $schema.outbox_events" >/dev/null
start=$(date +%s.%N)
relays=${RELAYS:-1}
pids=()
for i in $(seq 1 "$relays"); do
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%M' -o /tmp/txo_drain_rss.$$.$i "$bin" relay --publisher "$publisher" --drain "$@" &
  else
    echo 0 > /tmp/txo_drain_rss.$$.$i
    "$bin" relay --publisher "$publisher" --drain "$@" &
  fi
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
sort -n /tmp/txo_drain_rss.$$.* | tail -1 > /tmp/txo_drain_rss.$$; rm -f /tmp/txo_drain_rss.$$.*
end=$(date +%s.%N)
# Published = no longer pending (works for --retention-period 0 too); dead letters excluded.
left=$(psql -qAt "$db" -c "SELECT count(*) FROM $schema.outbox_events WHERE processed_at IS NULL")
# When the last event was published (the relay's exit may come later, e.g. flushing traces).
last=$(psql -qAt "$db" -c "SELECT coalesce(extract(epoch FROM max(processed_at)), 0) FROM $schema.outbox_events")
done_n=$((n - left))
rss=$(cat /tmp/txo_drain_rss.$$); rm -f /tmp/txo_drain_rss.$$
python3 -c "import sys; n,s,e,d,r,l=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]),int(sys.argv[4]),int(sys.argv[5]),float(sys.argv[7]); print(f'relays={sys.argv[6]} drained {d} of {n} events in {e-s:.2f} s: {d/(e-s):,.0f} events/s, peak RSS {r/1024:.0f} MiB; last published after {l-s:.2f} s: {d/max(l-s, 1e-9):,.0f} events/s published')" "$n" "$start" "$end" "$done_n" "$rss" "$relays" "$last"
