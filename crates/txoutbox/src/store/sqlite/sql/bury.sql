-- Dead-letter the claimed rows that do not decode (a JSON array ?1 of [seq, last error]),
-- fenced by the claim token ?2.
UPDATE {{table}} AS e SET dead_at = {{now_ms}}, last_error = f.err, {{lease_cleared}}
FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS err
      FROM json_each(?1)) AS f
WHERE e.seq = f.seq AND e.lock_token = ?2
