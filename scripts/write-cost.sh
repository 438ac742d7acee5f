#!/usr/bin/env bash
# What txoutbox's outbox row costs a writer, part by part, with pgbench alone (no relay): 16
# clients commit a business insert (`orders`) alone, and with one event inserted by the seed's
# literal INSERT into txoutbox's own table, as `txoutbox migrate` makes it, then with parts of
# it taken away: the wake-up trigger; the trigger and the partition index, as
# `txoutbox migrate --source wal` makes the table (`lean`, the WAL source's lean write path);
# and everything but the primary key and the pending index (the seed's UUID row). Variants are interleaved in each round; each
# round prints commits/s and the ratio to `biz` of the same round, the end the medians.
#   scripts/write-cost.sh                 # 3 rounds, 8 s per point
#   scripts/write-cost.sh 5 10            # ROUNDS SECONDS
# Env: DATABASE_URL (its host, port, user and parameters; the database is write_cost, made and
# dropped here; the role needs CREATEDB and CHECKPOINT), TXOUTBOX_BIN (default:
# target/release/txoutbox, built if missing), CLIENTS (16).
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
export LC_ALL=C
. "$(dirname "$0")/bench-record.sh"
rounds=${1:-3}; secs=${2:-8}; clients=${CLIENTS:-16}
case "$rounds$secs$clients" in *[!0-9]* | '') echo "write-cost: ROUNDS, SECONDS and CLIENTS are whole numbers" >&2; exit 2 ;; esac
[ "$rounds" -ge 1 ] || { echo "write-cost: ROUNDS must be at least 1" >&2; exit 2; }
bench_record "$0" "$rounds" "$secs"
cd "$(dirname "$0")/.."
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
# postgres://user@host:port/db?params -> base (without the database) and ?params (kept).
query=${url#"${url%%\?*}"}
base=${url%%\?*}
case $base in
  postgres://*/* | postgresql://*/*) base=${base%/*} ;;
  postgres://* | postgresql://*) ;;
  *) echo "write-cost: DATABASE_URL must be a postgres:// URL" >&2; exit 2 ;;
esac
db=write_cost
bin=${TXOUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/txoutbox}
if [ ! -x "$bin" ]; then
  cargo build -q --release -p txoutbox-cli --bin txoutbox
fi
export PGDATABASE=$db
psql_admin() { PGOPTIONS='-c client_min_messages=warning' psql -qX -v ON_ERROR_STOP=1 "$base/postgres$query" "$@"; }
psql_db() { PGOPTIONS='-c client_min_messages=warning' psql -qX -v ON_ERROR_STOP=1 "$base/$db$query" "$@"; }
psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
tmp=$(mktemp -d -t write-cost.XXXXXX)
trap 'rm -rf "$tmp"; psql_admin -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

psql_db -c "CREATE SCHEMA wc; CREATE TABLE wc.orders (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer_id text NOT NULL,
  total numeric(12,2) NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
variants=(full no_trigger lean seed_row)
for v in "${variants[@]}"; do
  env -u TXOUTBOX_CONFIG DATABASE_URL="$base/$db$query" TXOUTBOX_SCHEMA="wc_$v" \
    TXOUTBOX_TABLE=outbox_events TXOUTBOX_LOG=warn "$bin" migrate >/dev/null
done
# The lean write path, as an operator makes it for a table only the WAL source reads.
env -u TXOUTBOX_CONFIG DATABASE_URL="$base/$db$query" TXOUTBOX_SCHEMA=wc_lean \
  TXOUTBOX_TABLE=outbox_events TXOUTBOX_LOG=warn TXOUTBOX_SOURCE=wal "$bin" migrate >/dev/null
psql_db <<'SQL'
ALTER TABLE wc_no_trigger.outbox_events DISABLE TRIGGER USER;
-- What the seed's UUID row has: the primary key and one partial index of pending events.
ALTER TABLE wc_seed_row.outbox_events DISABLE TRIGGER USER;
ALTER TABLE wc_seed_row.outbox_events DROP COLUMN partition_key CASCADE;
ALTER TABLE wc_seed_row.outbox_events DROP CONSTRAINT outbox_payload_kind;
DROP INDEX wc_seed_row.outbox_dead, wc_seed_row.outbox_dead_seq, wc_seed_row.outbox_handed_off,
  wc_seed_row.outbox_published_seq;
SQL

cat > "$tmp/biz.sql" <<'SQL'
\set cid random(1, 1000)
BEGIN;
INSERT INTO wc.orders (customer_id, total) VALUES ('cust-' || :cid, 42.50);
COMMIT;
SQL
for v in "${variants[@]}"; do
  cat > "$tmp/$v.sql" <<SQL
\set cid random(1, 1000)
\set oid random(1, 2000000000)
BEGIN;
INSERT INTO wc.orders (customer_id, total) VALUES ('cust-' || :cid, 42.50);
INSERT INTO wc_$v.outbox_events (aggregate_type, aggregate_id, event_type, payload)
  VALUES ('order', 'ord-' || :oid, 'order.created',
          ('{"id":"ord-' || :oid || '","customer_id":"cust-' || :cid || '","total":42.5}')::jsonb);
COMMIT;
SQL
done

truncate_all="TRUNCATE wc.orders$(printf ', wc_%s.outbox_events' "${variants[@]}")"
echo "write cost: $clients clients, ${secs}s per point, $rounds round(s); commits/s (ratio to biz)"
for r in $(seq "$rounds"); do
  line="round $r:"
  biz=
  for v in biz "${variants[@]}"; do
    psql_db -c "$truncate_all" -c "CHECKPOINT"
    out=$(pgbench -n -M prepared -c "$clients" -j 2 -T "$secs" -f "$tmp/$v.sql" "$base/$db$query" 2>&1) ||
      { printf 'write-cost: pgbench failed for %s:\n%s\n' "$v" "$out" >&2; exit 1; }
    tps=$(printf '%s\n' "$out" | awk '/^tps = / { print $3; exit }')
    [ -n "$tps" ] || { printf 'write-cost: no tps from pgbench for %s:\n%s\n' "$v" "$out" >&2; exit 1; }
    [ "$v" = biz ] && biz=$tps
    ratio=$(awk -v a="$tps" -v b="$biz" 'BEGIN { printf "%.2f", a / b }')
    printf '%s\t%s\t%s\n' "$v" "$tps" "$ratio" >> "$tmp/all.tsv"
    line+=$(printf ' %s %.0f (%s)' "$v" "$tps" "$ratio")
  done
  echo "$line"
done
echo "medians (min-max) of the ratio to biz:"
for v in "${variants[@]}"; do
  awk -F'\t' -v v="$v" '$1 == v { print $3 }' "$tmp/all.tsv" | sort -n |
    awk -v v="$v" '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2;
      printf "  %-32s %.2fx (%s-%s)\n", v, m, a[1], a[NR] }'
done
