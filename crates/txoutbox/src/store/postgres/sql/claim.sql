-- The row-lease claim of an unordered relay that owns no partition (claim_owned.sql is the
-- claim of one that does): one autocommit statement: pick available rows in seq order, skip
-- rows another relay holds (by row lease, or by owning their partition under a live lease),
-- and lease them, up to the byte budget (within_bytes.sql). A relay that owns a partition
-- under a live lease gets nothing here. No transaction stays open while publishing. An event
-- over the per-event ceiling comes without its payload, and its size: the claim dead-letters
-- it. $1 limit, $2 lease (ms), $3 relay id, $4 token, $5 the seq floor (0: from the start),
-- $6 the byte budget, $7 the per-event ceiling, $8 the partition count.
WITH RECURSIVE lim AS (SELECT $6::int8 AS batch, $7::int8 AS event),
held AS (
   SELECT partition, owner FROM {{partitions}} WHERE owner IS NOT NULL AND lease_until > now()
),
c AS (
   SELECT e.id, e.seq, {{stored_size}} FROM {{table}} e
   WHERE {{unfinished}} AND available_at <= now()
     AND (locked_until IS NULL OR locked_until <= now())
     AND seq > $5
     AND NOT (e.partition_key % $8 = ANY (ARRAY(SELECT partition FROM held)))
     AND NOT EXISTS (SELECT 1 FROM held WHERE owner = $3)
   ORDER BY seq
   LIMIT $1
   FOR UPDATE SKIP LOCKED
),
{{within_bytes}}
UPDATE {{table}} AS e
SET locked_until = now() + $2 * interval '1 millisecond', locked_by = $3, lock_token = $4
FROM b WHERE e.id = b.id
RETURNING e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type,
  CASE WHEN b.size > $7 THEN NULL ELSE e.payload END AS payload,
  CASE WHEN b.size > $7 THEN NULL ELSE e.payload_bytes END AS payload_bytes, e.content_type,
  e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at, e.processed_at, e.dead_at,
  e.locked_by, e.locked_until, e.last_error, b.size AS payload_size
