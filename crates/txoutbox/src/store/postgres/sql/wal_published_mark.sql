-- Events the WAL source published ($1 ids), kept with `processed_at` set (retention `mark`);
-- in wal_settle, only if its transactions are visible (vis).
UPDATE {{table}} SET processed_at = now(), last_error = NULL
WHERE id = ANY($1) AND processed_at IS NULL AND (SELECT * FROM vis) RETURNING 1
