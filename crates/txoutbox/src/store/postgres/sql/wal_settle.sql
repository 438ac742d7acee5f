-- A batch the WAL source read from the stream, settled in one statement before the slot is
-- confirmed past it: the published events ($1), the failed ones ({{failures}}), recorded and
-- handed to the table path, and those held back unattempted ($5 ids, $8 why) because an
-- earlier event of their aggregate waits in the table, handed over too. Only if every one of
-- the batch's transactions ($9 ids) is visible in the statement's snapshot, which its
-- updates share: else nothing changes, and the last column says so.
WITH vis AS ({{visible}}),
ok AS ({{wal_published}}),
bad AS (
   UPDATE {{table}} AS e
   SET {{failed}}, handed_off_at = now()
   FROM {{failures}}
   WHERE e.id = f.id AND e.processed_at IS NULL AND (SELECT * FROM vis)
   RETURNING 1
),
held AS (
   UPDATE {{table}} SET handed_off_at = now(), last_error = $8
   WHERE id = ANY($5) AND processed_at IS NULL AND handed_off_at IS NULL
     AND (SELECT * FROM vis)
   RETURNING 1
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad), (SELECT count(*) FROM held),
       (SELECT * FROM vis)
