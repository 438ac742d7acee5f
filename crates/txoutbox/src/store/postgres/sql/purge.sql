-- At most $2 published events older than $1 ms, lowest seq first, through the index of
-- published rows by seq (`published_seq`). There is no index on `processed_at` (migration 7):
-- every settle would pay an entry in it, for this statement alone.
--
-- `w` walks the published rows in seq order and takes the old ones and the young ones
-- (created after the cutoff, so published after it too), $2 rows in all; the old ones before
-- the first young one go. Where nothing is old the walk ends after $2 rows; where a backlog
-- was published late (rows created before the cutoff, published after it) it steps over them,
-- at every purge until they age. A row past the first young one that is old (its transaction
-- was open while later rows were written) waits until the cutoff passes those rows, at most as
-- long as that transaction was open.
--
-- `picked` locks them (rows another transaction holds are skipped) with the condition
-- repeated, so a row changed in between is left alone; ctid = ANY(ARRAY(...)) is a TID scan,
-- and $2 bounds the locks and the WAL of one statement.
WITH w AS MATERIALIZED (
   SELECT ctid, seq, created_at >= now() - $1 * interval '1 millisecond' AS young
   FROM {{table}}
   WHERE processed_at IS NOT NULL
     AND (processed_at < now() - $1 * interval '1 millisecond'
          OR created_at >= now() - $1 * interval '1 millisecond')
   ORDER BY seq
   LIMIT $2
), picked AS (
   SELECT ctid FROM {{table}}
   WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM w
       WHERE NOT young
         AND seq < coalesce((SELECT min(seq) FROM w WHERE young), 9223372036854775807)))
     AND processed_at < now() - $1 * interval '1 millisecond'
   FOR UPDATE SKIP LOCKED
)
DELETE FROM {{table}} WHERE ctid = ANY(ARRAY(SELECT ctid FROM picked))
  AND processed_at < now() - $1 * interval '1 millisecond'
