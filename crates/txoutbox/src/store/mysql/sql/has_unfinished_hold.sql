-- Unfinished events that no dead letter of their aggregate holds back (`hold` mode).
SELECT EXISTS (SELECT 1 FROM {{table}} e WHERE e.processed_at IS NULL AND e.dead_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM {{table}} b
    WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
      AND b.processed_at IS NULL AND b.seq < e.seq AND b.dead_at IS NOT NULL))
