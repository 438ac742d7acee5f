-- Put the dead letters matching `{{condition}}` (`EventFilter::to_sql`) back in line.
UPDATE {{table}} SET dead_at = NULL, attempts = 0, attempts_unavailable = 0,
   available_at = {{now_ms}}, last_error = NULL
WHERE {{condition}}
