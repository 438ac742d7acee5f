-- Published rows of an ordered claim (`published_rows`, as in published_mark.sql) in the
-- partitions it still holds (`mine`, $8: partition count), kept with `processed_at` set.
UPDATE {{table}} SET processed_at = now(), last_error = NULL
WHERE {{published_rows}} AND processed_at IS NULL
  AND partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine)) RETURNING 1
