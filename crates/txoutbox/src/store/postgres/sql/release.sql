UPDATE {{table}} SET locked_until = NULL, locked_by = NULL, lock_token = NULL
WHERE id = ANY($1) AND lock_token = $2
