-- Published rows of an ordered claim ($1 ids) in the partitions it still holds (`mine`, $8:
-- partition count), deleted (retention `delete`).
DELETE FROM {{table}} WHERE id = ANY($1)
  AND partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine)) RETURNING 1
