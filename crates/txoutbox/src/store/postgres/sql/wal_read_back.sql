-- The rows of events read from the stream ($1 ids), as the table holds them now: the WAL
-- source publishes what committed (a row deleted, updated or inserted published, dead or not
-- yet due is seen as it is), not what was first inserted. Only if every one of their
-- transactions ({{xids}}) is visible in the statement's snapshot, which the first column
-- says: with false, one row of NULLs; with true and none of the rows left, one too.
SELECT v.visible, e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload,
  e.payload_bytes, e.content_type, e.headers, e.attempts, e.attempts_unavailable,
  e.available_at, e.created_at, e.processed_at, e.dead_at, e.locked_by, e.locked_until,
  e.last_error, e.handed_off_at IS NOT NULL AS handed_off, e.available_at > now() AS not_due
FROM ({{visible}}) AS v(visible)
LEFT JOIN {{table}} e ON v.visible AND e.id = ANY($1)
