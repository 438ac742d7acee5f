-- The table path of a WAL relay: claim handed-off events (see migration 4), leased like the
-- unordered claim. Ordered ($5), an event waits while an earlier event of its aggregate backs
-- off, is leased, or (with $6, `hold`) is dead: one short probe of the `blocking` index.
-- And (`c`) while an earlier one in that index, not dead, is missing from the rows this claim
-- locked (`locked`) though nothing above held it back: SKIP LOCKED passed it over because
-- another statement held its row at that moment (the outage watch's retry_now, making failed
-- events due as their broker answers again). Else its later events would go out ahead of it.
-- What neither can see is an earlier event another relay's claim has leased but not yet
-- committed (not in `blocking` for this statement's snapshot, and skipped as locked): ordered
-- claims therefore run one at a time per table, each in a transaction behind an advisory lock
-- (table_path.rs), so this statement starts after the other's commit.
-- Up to the byte budget, as claim.sql. $1 limit, $2 lease (ms), $3 relay id, $4 token, $7 the
-- byte budget, $8 the per-event ceiling.
WITH RECURSIVE lim AS (SELECT $7::int8 AS batch, $8::int8 AS event),
locked AS (
   SELECT e.id, e.seq, e.partition_key, e.aggregate_type, e.aggregate_id, {{stored_size}}
   FROM {{table}} e
   WHERE e.handed_off_at IS NOT NULL AND e.processed_at IS NULL AND e.dead_at IS NULL
     AND e.available_at <= now()
     AND (e.locked_until IS NULL OR e.locked_until <= now())
     AND NOT ($5 AND EXISTS (
       SELECT 1 FROM {{table}} b
       WHERE b.partition_key = e.partition_key AND b.seq < e.seq
         AND {{blocking}}
         AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
         AND ((b.dead_at IS NULL AND (b.available_at > now() OR b.locked_until > now()))
              OR (b.dead_at IS NOT NULL AND $6))
       OFFSET 0))
   ORDER BY e.seq
   LIMIT $1
   FOR UPDATE OF e SKIP LOCKED
),
c AS (
   SELECT l.* FROM locked l
   WHERE NOT ($5 AND EXISTS (
     SELECT 1 FROM {{table}} b
     WHERE b.partition_key = l.partition_key AND b.seq < l.seq
       AND {{blocking}}
       AND b.aggregate_type = l.aggregate_type AND b.aggregate_id = l.aggregate_id
       AND b.handed_off_at IS NOT NULL AND b.dead_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM locked x WHERE x.id = b.id)
     OFFSET 0))
),
{{within_bytes}}
UPDATE {{table}} AS e
SET locked_until = now() + $2 * interval '1 millisecond', locked_by = $3, lock_token = $4
FROM b WHERE e.id = b.id
RETURNING e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type,
  CASE WHEN b.size > $8 THEN NULL ELSE e.payload END AS payload,
  CASE WHEN b.size > $8 THEN NULL ELSE e.payload_bytes END AS payload_bytes, e.content_type,
  e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at, e.processed_at, e.dead_at,
  e.locked_by, e.locked_until, e.last_error, b.size AS payload_size
