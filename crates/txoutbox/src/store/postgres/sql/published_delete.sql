-- Published rows of a row-lease claim ($1 ids, $5 token), deleted (retention `delete`).
DELETE FROM {{table}} WHERE id = ANY($1) AND lock_token = $5 RETURNING 1
