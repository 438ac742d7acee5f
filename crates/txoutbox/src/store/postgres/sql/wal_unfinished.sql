-- Is a handed-off event still to be published by the table path? With $1 (`hold`), events
-- held back behind a dead letter of their aggregate do not count (they wait for an operator).
SELECT EXISTS (SELECT 1 FROM {{table}} e
  WHERE e.handed_off_at IS NOT NULL AND e.processed_at IS NULL AND e.dead_at IS NULL
    AND NOT ($1 AND EXISTS (
      SELECT 1 FROM {{table}} b WHERE b.partition_key = e.partition_key
        AND b.seq < e.seq AND {{blocking}} AND b.dead_at IS NOT NULL
        AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
      OFFSET 0)))
