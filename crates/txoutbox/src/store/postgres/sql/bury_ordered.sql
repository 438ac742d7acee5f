-- Dead-letter the rows of an ordered claim that do not decode ($1 ids, $2 last errors), fenced
-- by the partition lease of relay $4 ($3: partition count).
UPDATE {{table}} AS e SET dead_at = now(), last_error = f.err
FROM unnest($1::uuid[], $2::text[]) AS f(id, err)
WHERE e.id = f.id AND e.processed_at IS NULL AND e.dead_at IS NULL
  AND e.partition_key % $3 = ANY (ARRAY(
    SELECT partition FROM {{partitions}} WHERE owner = $4 AND lease_until > now()))
