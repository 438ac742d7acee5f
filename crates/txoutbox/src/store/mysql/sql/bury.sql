-- Dead-letter the claimed rows that do not decode (a JSON array of [seq, last error]), by
-- seq (their id may not be a UUID), fenced by the claim token.
UPDATE {{table}} e
JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', err LONGTEXT PATH '$[1]')) AS f
  ON e.seq = f.seq
SET e.dead_at = {{now_ms}}, e.last_error = f.err,
    e.locked_until = NULL, e.locked_by = NULL, e.lock_token = NULL
WHERE e.lock_token = ?
