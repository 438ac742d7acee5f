-- The whole batch in one statement: successes and failures, both fenced by the claim token
-- ($5), so a relay that lost its lease changes nothing. A failure counts only while the lease
-- holds: once it ran out, a relay that owns the row's partition may have taken the row
-- without writing to it (claim_owned.sql), token and all, and its own result must stand (a
-- late success is harmless: the row was sent, and a row already published stays as it is).
WITH ok AS ({{published}}),
bad AS (
   UPDATE {{table}} AS e
   SET {{failed}}, locked_until = NULL, locked_by = NULL, lock_token = NULL
   FROM {{failures}}
   WHERE e.id = f.id AND e.lock_token = $5 AND e.locked_until > now()
   RETURNING 1
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad)
