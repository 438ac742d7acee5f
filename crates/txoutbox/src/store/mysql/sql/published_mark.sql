-- Published rows (`{{list}}`: a mark per id), fenced by the claim token, kept with
-- `processed_at` set.
UPDATE {{table}} SET processed_at = {{now_ms}}, {{lease_cleared}}, last_error = NULL
WHERE id IN ({{list}}) AND lock_token = ?
