-- Ordered: no earlier event of the aggregate leased, backing off or (with ?5, `hold`) dead.
AND NOT EXISTS (
   SELECT 1 FROM {{table}} b
   WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
     AND b.seq < e.seq AND b.processed_at IS NULL
     AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
     AND ((b.dead_at IS NULL AND (b.available_at > {{now_ms}} OR b.locked_until > {{now_ms}}))
          OR (b.dead_at IS NOT NULL AND ?5))
)
