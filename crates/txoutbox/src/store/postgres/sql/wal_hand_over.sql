-- A transaction past the WAL source's bound on what it holds, handed to the table path whole
-- once it committed: its rows by seq ($1 lows, $2 highs, inclusive ranges) still pending and
-- not handed over yet, with $3 as why. Rows of other transactions in those ranges are left
-- alone or harmless: those committed before it the stream has settled already (published,
-- deleted or handed over); one committed since is handed over, and the stream skips it as
-- the table path's. Only if the transaction ({{xids}}) is visible: the second column says so.
WITH vis AS ({{visible}}),
h AS (
   UPDATE {{table}} AS e SET handed_off_at = now(), last_error = coalesce(e.last_error, $3)
   FROM unnest($1::int8[], $2::int8[]) AS r(lo, hi)
   WHERE e.seq BETWEEN r.lo AND r.hi
     AND e.processed_at IS NULL AND e.dead_at IS NULL AND e.handed_off_at IS NULL
     AND (SELECT * FROM vis)
   RETURNING 1
)
SELECT (SELECT count(*) FROM h), (SELECT * FROM vis)
