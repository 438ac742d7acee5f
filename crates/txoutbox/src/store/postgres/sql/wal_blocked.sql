-- Which aggregates wait in the table: they have a handed-off event not yet published (dead
-- ones count with $1, `hold`). Of the aggregates $2/$3 (types, ids), or of all with $2 NULL.
-- The WAL source hands such an aggregate's later events to the table too, behind it.
SELECT DISTINCT aggregate_type, aggregate_id FROM {{table}}
WHERE handed_off_at IS NOT NULL AND processed_at IS NULL AND (dead_at IS NULL OR $1)
  AND ($2::text[] IS NULL
       OR (aggregate_type, aggregate_id) IN (SELECT * FROM unnest($2::text[], $3::text[])))
