-- The whole batch in one statement: successes and failures, both fenced by the claim token
-- ($5), so a relay that lost its lease changes nothing.
WITH ok AS ({{published}}),
bad AS (
   UPDATE {{table}} AS e
   SET {{failed}}, locked_until = NULL, locked_by = NULL, lock_token = NULL
   FROM {{failures}}
   WHERE e.id = f.id AND e.lock_token = $5
   RETURNING 1
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad)
