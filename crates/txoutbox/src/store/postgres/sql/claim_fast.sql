-- The fast form of a read-only claim (claim_ordered.sql, claim_owned.sql): their candidates
-- `c`, as they are, then this in place of the byte budget's walk. Budgeting needs every
-- candidate's size before the first goes out, so `c` was kept in a tuplestore, read again for
-- its sum and for the lowest seq (the head's row): half of the statement's time, for a budget
-- that $1 small events cannot pass. Here `c` is read once, each candidate is small or not
-- (not compressed, and at most the budget's share of one event, `$7 / $1`, and the per-event
-- ceiling, $8: $1 small events fit the budget whatever they are), and the head comes as a row
-- of its own (`id` NULL). A candidate that is not small comes without its payload and its size
-- (`payload_size` NULL): the relay then runs the full statement instead (claim.rs
-- `fetch_claim`). Nothing is written either way.
cap AS (SELECT least(batch / greatest($1::int8, 1), event) AS bytes FROM lim)
SELECT c.id, c.seq, c.aggregate_type, c.aggregate_id, c.event_type,
  CASE WHEN NOT c.compressed AND c.stored <= (SELECT bytes FROM cap) THEN c.payload END AS payload,
  CASE WHEN NOT c.compressed AND c.stored <= (SELECT bytes FROM cap) THEN c.payload_bytes END
    AS payload_bytes,
  c.content_type, c.headers, c.attempts, c.attempts_unavailable, c.available_at, c.created_at,
  c.processed_at, c.dead_at, c.locked_by, c.locked_until, c.last_error{{key}},
  NULL::float8 AS lease_left, NULL::int4[] AS fence_partitions, NULL::int8[] AS fence_epochs,
  CASE WHEN NOT c.compressed AND c.stored <= (SELECT bytes FROM cap) THEN c.stored END
    AS payload_size
FROM c
UNION ALL
SELECT NULL::uuid, NULL::int8, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::bytea,
  NULL::text, NULL::jsonb, NULL::int4, NULL::int4, NULL::timestamptz, NULL::timestamptz,
  NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::timestamptz, NULL::text{{key_null}},
  extract(epoch FROM (SELECT min(lease_until) FROM owned) - now())::float8,
  (SELECT array_agg(partition ORDER BY partition) FROM owned),
  (SELECT array_agg(epoch ORDER BY partition) FROM owned), NULL::int8
