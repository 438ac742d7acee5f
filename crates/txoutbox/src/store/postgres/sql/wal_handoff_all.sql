-- Hand every unpublished event that the stream will not deliver to the table path: those
-- committed before the slot was created (first start, or after the slot was lost). $1 why.
WITH h AS (
   UPDATE {{table}} SET handed_off_at = now(), last_error = coalesce(last_error, $1)
   WHERE processed_at IS NULL AND handed_off_at IS NULL
   RETURNING 1
)
SELECT count(*) FROM h
