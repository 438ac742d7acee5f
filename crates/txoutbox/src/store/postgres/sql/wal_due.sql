-- Seconds until the earliest handed-off event the table path can claim is due ($1 ordered:
-- only events no earlier event of their aggregate holds back; $2 hold: dead ones hold back).
-- As a difference of epochs, as in due.sql (`available_at = 'infinity'`).
SELECT (extract(epoch FROM min(greatest(e.available_at, coalesce(e.locked_until, e.available_at))))
        - extract(epoch FROM now()))::float8
FROM {{table}} e
WHERE e.handed_off_at IS NOT NULL AND e.processed_at IS NULL AND e.dead_at IS NULL
  AND NOT ($1 AND EXISTS (
    SELECT 1 FROM {{table}} b
    WHERE b.partition_key = e.partition_key AND b.seq < e.seq
      AND {{blocking}}
      AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
      AND (b.dead_at IS NULL OR $2)
    OFFSET 0))
