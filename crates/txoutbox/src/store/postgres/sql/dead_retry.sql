-- Put the dead letters matching `{{condition}}` (per call: `EventFilter::to_sql`) back in
-- line, and notify the relays' channel (`{{channel}}`: the mark its name is bound to) in the
-- same statement.
WITH r AS (
   UPDATE {{table}} SET dead_at = NULL, attempts = 0, attempts_unavailable = 0,
       available_at = now(), last_error = NULL
   WHERE {{condition}} RETURNING 1
)
SELECT count(*), pg_notify({{channel}}, '') FROM r
