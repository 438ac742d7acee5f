-- Back off or dead-letter the failures of a settle (rows::failures_json), fenced by the claim
-- token.
UPDATE {{table}} e
JOIN JSON_TABLE(?, '$[*]' COLUMNS (
    id CHAR(36) PATH '$[0]',
    err LONGTEXT PATH '$[1]',
    delay_ms BIGINT PATH '$[2]',
    dead INT PATH '$[3]',
    unavailable INT PATH '$[4]'
)) AS f ON e.id = f.id
SET e.attempts = e.attempts + 1,
    e.attempts_unavailable = e.attempts_unavailable + f.unavailable,
    e.last_error = f.err,
    e.available_at = {{now_ms}} + f.delay_ms,
    e.dead_at = CASE WHEN f.dead = 1 THEN {{now_ms}} END,
    e.locked_until = NULL, e.locked_by = NULL, e.lock_token = NULL
WHERE e.lock_token = ?
