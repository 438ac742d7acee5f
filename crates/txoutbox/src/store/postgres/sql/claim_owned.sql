-- Unordered: read-only, like the ordered claim (claim_ordered.sql), without its aggregate
-- fences. Only partitions this relay owns under a live lease (with a margin, so a claim never
-- overlaps a takeover); any available event in them, in seq order, except those this relay
-- still has in flight ($6: their seqs, in a hashed subplan; usually none, since while claims
-- come back full the next one starts past the highest seq claimed, $4). It writes nothing:
-- the partition lease is the claim, and the settle is fenced by partition ownership and
-- epoch (settle_ordered.sql). A row a row-lease claim holds (locked_until ahead) is left to
-- it. `lease_left` and the fence come on the lowest seq's row only, as in the ordered claim, and the
-- walk of the pending index runs only if one of the owned partitions has an event available
-- at all (one probe of the partition index per partition).
-- Up to the byte budget (within_bytes.sql; an event over the per-event ceiling comes without
-- its payload, and its size: the claim dead-letters it).
-- $1 limit, $2 relay id, $3 partition count, $4 the seq floor (exclusive; 0: from the
-- start), $5 the seq ceiling (inclusive), $6 seqs to skip, $7 the byte budget, $8 the
-- per-event ceiling.
WITH RECURSIVE lim AS (SELECT $7::int8 AS batch, $8::int8 AS event),
owned AS (
   SELECT partition, lease_until, epoch FROM {{partitions}}
   WHERE owner = $2 AND lease_until > now() + interval '{{claim_margin_ms}} milliseconds'
),
c AS (
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.payload_bytes, e.content_type,
  {{stored_size}}, e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at,
  e.processed_at, e.dead_at, e.locked_by, e.locked_until, e.last_error
FROM {{table}} e
WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now()
  AND (e.locked_until IS NULL OR e.locked_until <= now())
  AND e.partition_key % $3 = ANY (ARRAY(SELECT partition FROM owned))
  AND e.seq > $4 AND e.seq <= $5
  AND e.seq NOT IN (SELECT unnest($6::int8[]))
  AND EXISTS (SELECT 1 FROM owned o WHERE EXISTS (
    SELECT 1 FROM {{table}} x
    WHERE (x.partition_key & 63) = o.partition
      AND x.processed_at IS NULL AND x.dead_at IS NULL AND x.available_at <= now()
      AND (x.locked_until IS NULL OR x.locked_until <= now())))
ORDER BY e.seq
LIMIT $1
),
{{within_bytes}},
-- The head on the lowest seq's row only, and the rows in no particular order: as in
-- claim_ordered.sql.
head AS (
  SELECT min(c.seq) AS seq,
    extract(epoch FROM (SELECT min(lease_until) FROM owned) - now())::float8 AS lease_left,
    (SELECT array_agg(partition ORDER BY partition) FROM owned) AS fence_partitions,
    (SELECT array_agg(epoch ORDER BY partition) FROM owned) AS fence_epochs
  FROM c
),
sized AS (
  SELECT c.*, c.stored AS size FROM c WHERE (SELECT fits FROM fast)
  UNION ALL
  SELECT c.*, b.size FROM c JOIN b ON b.id = c.id WHERE NOT (SELECT fits FROM fast)
)
SELECT s.id, s.seq, s.aggregate_type, s.aggregate_id, s.event_type,
  CASE WHEN s.size > $8 THEN NULL ELSE s.payload END AS payload,
  CASE WHEN s.size > $8 THEN NULL ELSE s.payload_bytes END AS payload_bytes, s.content_type,
  s.headers, s.attempts, s.attempts_unavailable, s.available_at, s.created_at, s.processed_at,
  s.dead_at, s.locked_by, s.locked_until, s.last_error,
  CASE WHEN s.seq = h.seq THEN h.lease_left END AS lease_left,
  CASE WHEN s.seq = h.seq THEN h.fence_partitions END AS fence_partitions,
  CASE WHEN s.seq = h.seq THEN h.fence_epochs END AS fence_epochs, s.size AS payload_size
FROM sized s CROSS JOIN head h
