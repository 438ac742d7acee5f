-- A throwaway schema "exp" with an outbox-shaped table (same columns and indexes as migrations
-- 0001+0002) holding 100k events over 1000 aggregates. Used by scripts/claim-bench/run.sh.
DROP SCHEMA IF EXISTS exp CASCADE; CREATE SCHEMA exp;
CREATE TABLE exp.o (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq bigint GENERATED ALWAYS AS IDENTITY,
    aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
    payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}',
    attempts int NOT NULL DEFAULT 0, attempts_unavailable int NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    locked_until timestamptz, locked_by text, lock_token uuid, last_error text,
    created_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz, dead_at timestamptz,
    partition_key integer GENERATED ALWAYS AS ((('x' || left(md5(aggregate_type || '/' || aggregate_id), 8))::bit(32)::integer) & 2147483647) STORED);
CREATE INDEX o_pending ON exp.o (seq) WHERE processed_at IS NULL AND dead_at IS NULL;
CREATE INDEX o_dead ON exp.o (dead_at) WHERE dead_at IS NOT NULL AND processed_at IS NULL;
CREATE INDEX o_blocking ON exp.o (partition_key, seq) WHERE processed_at IS NULL AND (locked_until IS NOT NULL OR attempts > 0 OR dead_at IS NOT NULL);
CREATE INDEX o_processed ON exp.o (processed_at) WHERE processed_at IS NOT NULL;
INSERT INTO exp.o (aggregate_type, aggregate_id, event_type, payload)
SELECT 'order', 'agg-' || (g % 1000), 'created', jsonb_build_object('n', g, 'pad', repeat('x', 100)) FROM generate_series(1, 100000) g;
VACUUM ANALYZE exp.o;
