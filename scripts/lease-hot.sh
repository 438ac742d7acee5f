#!/usr/bin/env bash
# Could the unordered row lease be made cheap instead of dropped? What the lease UPDATE
# (`locked_until`, `locked_by`, `lock_token`, 500 rows per statement, as the row-lease claim
# writes them) and then the settle cost in WAL per event, on a copy of the outbox table with its
# indexes, 20,000 events, after a CHECKPOINT, in four variants: A the table as migrated (the
# `blocking` index's condition names `locked_until`, so no lease is a HOT update); B that
# condition without `locked_until`; C = B with fillfactor 70 (room on each page for HOT
# updates); D = A with fillfactor 70. Prints WAL bytes per event of the lease and of the
# settle after it, and how many lease updates were HOT. The read-only claim writes none.
# Needs psql; DATABASE_URL defaults to the local test database. Works in a schema of its own
# (lease_hot), dropped at the end. BENCH_OUT=FILE also writes the output to FILE.
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
P=(psql -qAtX "$url" -v ON_ERROR_STOP=1)
run() { # name, blocking index condition, fillfactor
  "${P[@]}" >/dev/null <<SQL
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS lease_hot CASCADE; CREATE SCHEMA lease_hot;
CREATE TABLE lease_hot.t (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
 seq bigint GENERATED ALWAYS AS IDENTITY, aggregate_type text NOT NULL,
 aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL,
 headers jsonb NOT NULL DEFAULT '{}', attempts int NOT NULL DEFAULT 0,
 attempts_unavailable int NOT NULL DEFAULT 0, available_at timestamptz NOT NULL DEFAULT now(),
 locked_until timestamptz, locked_by text, lock_token uuid, last_error text,
 created_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz, dead_at timestamptz,
 partition_key int GENERATED ALWAYS AS ((('x' || left(md5(aggregate_type || '/' || aggregate_id), 8))::bit(32)::integer) & 2147483647) STORED,
 handed_off_at timestamptz, payload_bytes bytea, content_type text) WITH (fillfactor = $3);
CREATE INDEX ON lease_hot.t (seq) WHERE processed_at IS NULL AND dead_at IS NULL;
CREATE INDEX ON lease_hot.t (dead_at) WHERE dead_at IS NOT NULL AND processed_at IS NULL;
CREATE INDEX ON lease_hot.t (partition_key, seq) WHERE $2;
CREATE INDEX ON lease_hot.t (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX ON lease_hot.t (seq) WHERE dead_at IS NOT NULL AND processed_at IS NULL;
CREATE INDEX ON lease_hot.t (seq) WHERE processed_at IS NOT NULL;
CREATE INDEX ON lease_hot.t ((partition_key & 63), seq) WHERE processed_at IS NULL AND dead_at IS NULL;
CREATE INDEX ON lease_hot.t (seq) WHERE handed_off_at IS NOT NULL;
INSERT INTO lease_hot.t (aggregate_type, aggregate_id, event_type, payload)
 SELECT 'order', 'o-' || (g % 1000), 'order.created',
   jsonb_build_object('i', g, 'pad', repeat('x', 180)) FROM generate_series(1, 20000) g;
VACUUM ANALYZE lease_hot.t;
CHECKPOINT;
SQL
  local a b lease hot settle i
  a=$("${P[@]}" -c "SELECT pg_current_wal_lsn()")
  for i in $(seq 0 39); do
    "${P[@]}" -c "UPDATE lease_hot.t SET locked_until = now() + interval '30 s', locked_by = 'relay-1', lock_token = gen_random_uuid() WHERE seq > $((i * 500)) AND seq <= $((i * 500 + 500))"
  done
  b=$("${P[@]}" -c "SELECT pg_current_wal_lsn()")
  lease=$("${P[@]}" -c "SELECT round(pg_wal_lsn_diff('$b', '$a') / 20000.0)")
  hot=$("${P[@]}" -c "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = 'lease_hot'")
  a=$b
  for i in $(seq 0 39); do
    "${P[@]}" -c "UPDATE lease_hot.t SET processed_at = now(), locked_until = NULL, locked_by = NULL, lock_token = NULL WHERE seq > $((i * 500)) AND seq <= $((i * 500 + 500))"
  done
  b=$("${P[@]}" -c "SELECT pg_current_wal_lsn()")
  settle=$("${P[@]}" -c "SELECT round(pg_wal_lsn_diff('$b', '$a') / 20000.0)")
  echo "$1: lease $lease WAL bytes/event ($hot of 20000 HOT), settle after it $settle"
}
with_lease="processed_at IS NULL AND (locked_until IS NOT NULL OR attempts > 0 OR dead_at IS NOT NULL)"
without="processed_at IS NULL AND (attempts > 0 OR dead_at IS NOT NULL)"
run "A as migrated" "$with_lease" 100
run "B blocking without locked_until" "$without" 100
run "C = B, fillfactor 70" "$without" 70
run "D = A, fillfactor 70" "$with_lease" 70
"${P[@]}" -c "SET client_min_messages = warning; DROP SCHEMA lease_hot CASCADE"
