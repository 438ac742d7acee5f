-- Make pending events ($1: ids) due now: their backoff waited out a publisher outage that has
-- ended. Leased, published and dead events stay as they are. Notifies the relays' channel ($2)
-- in the same statement, so that a waiting relay claims them at once.
WITH r AS (
   UPDATE {{table}} SET available_at = now()
   WHERE id = ANY($1) AND {{unfinished}} AND available_at > now()
     AND (locked_until IS NULL OR locked_until <= now())
   RETURNING 1
)
SELECT count(*), pg_notify($2, '') FROM r
