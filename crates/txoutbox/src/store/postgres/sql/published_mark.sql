-- Published rows of a row-lease claim ($1 ids, $5 token), kept with `processed_at` set.
UPDATE {{table}} SET processed_at = now(), locked_until = NULL, locked_by = NULL,
  lock_token = NULL, last_error = NULL
WHERE id = ANY($1) AND lock_token = $5 RETURNING 1
