-- Back off or dead-letter the failures of a settle (?1: rows::failures_json), fenced by the
-- claim token ?2.
UPDATE {{table}} AS e SET
   attempts = e.attempts + 1,
   attempts_unavailable = e.attempts_unavailable + f.unavailable,
   last_error = f.err,
   available_at = {{now_ms}} + f.delay_ms,
   dead_at = CASE WHEN f.dead THEN {{now_ms}} END,
   {{lease_cleared}}
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS err,
             json_extract(value, '$[2]') AS delay_ms, json_extract(value, '$[3]') AS dead,
             json_extract(value, '$[4]') AS unavailable
      FROM json_each(?1)) AS f
WHERE e.id = f.id AND e.lock_token = ?2
