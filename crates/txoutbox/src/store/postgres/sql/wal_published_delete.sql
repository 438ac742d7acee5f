-- Events the WAL source published ($1 ids), deleted (retention `delete`).
DELETE FROM {{table}} WHERE id = ANY($1) RETURNING 1
