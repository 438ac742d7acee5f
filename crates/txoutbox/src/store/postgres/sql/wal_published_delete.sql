-- Events the WAL source published ($1 ids), deleted (retention `delete`); in wal_settle,
-- only if its transactions are visible (vis).
DELETE FROM {{table}} WHERE id = ANY($1) AND (SELECT * FROM vis) RETURNING 1
