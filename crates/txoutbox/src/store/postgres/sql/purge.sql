-- At most $2 published events older than $1 ms. ctid = ANY(ARRAY(...)) is a TID scan: the
-- DELETE touches exactly the rows the sub-select picked, and the sub-select's LIMIT bounds the
-- locks and the WAL of one statement. Rows another transaction holds are skipped. The
-- condition is repeated so a row changed in between is left alone.
DELETE FROM {{table}} WHERE ctid = ANY(ARRAY(
   SELECT ctid FROM {{table}}
   WHERE processed_at < now() - $1 * interval '1 millisecond'
   LIMIT $2 FOR UPDATE SKIP LOCKED
)) AND processed_at < now() - $1 * interval '1 millisecond'
