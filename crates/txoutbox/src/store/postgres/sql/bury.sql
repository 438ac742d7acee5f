-- Dead-letter the rows of a row-lease claim that do not decode ($1 ids, $2 last errors),
-- fenced by the claim token ($3).
UPDATE {{table}} AS e SET dead_at = now(), last_error = f.err,
   locked_until = NULL, locked_by = NULL, lock_token = NULL
FROM unnest($1::uuid[], $2::text[]) AS f(id, err)
WHERE e.id = f.id AND e.lock_token = $3
