-- One autocommit statement: pick available rows in seq order, skip rows another relay holds,
-- and lease them. No transaction stays open while publishing. $1 limit, $2 lease (ms), $3 relay
-- id, $4 token, $5 the seq floor (0: from the start).
WITH c AS (
   SELECT id FROM {{table}}
   WHERE {{unfinished}} AND available_at <= now()
     AND (locked_until IS NULL OR locked_until <= now())
     AND seq > $5
   ORDER BY seq
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE {{table}} AS e
SET locked_until = now() + $2 * interval '1 millisecond', locked_by = $3, lock_token = $4
FROM c WHERE e.id = c.id
RETURNING e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.payload_bytes, e.content_type,
  e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at, e.processed_at, e.dead_at,
  e.locked_by, e.locked_until, e.last_error
