-- Published rows of an ordered claim (`published_rows`, as in published_mark.sql) in the
-- partitions it still holds (`mine`, $8: partition count), deleted (retention `delete`).
DELETE FROM {{table}} WHERE {{published_rows}}
  AND partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine)) RETURNING 1
