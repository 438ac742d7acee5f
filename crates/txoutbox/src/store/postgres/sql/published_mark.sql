-- Published rows of a row-lease claim (`published_rows`: published_by_seq.sql, or
-- published_by_id.sql), kept with `processed_at` set, fenced by the claim token ($5).
UPDATE {{table}} SET processed_at = now(), locked_until = NULL, locked_by = NULL,
  lock_token = NULL, last_error = NULL
WHERE {{published_rows}} AND lock_token = $5 RETURNING 1
