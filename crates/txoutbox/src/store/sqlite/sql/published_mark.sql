-- Published rows (?1, ?2: fenced_ids.sql), kept with `processed_at` set.
UPDATE {{table}} SET processed_at = {{now_ms}}, {{lease_cleared}}, last_error = NULL
WHERE {{fenced_ids}}
