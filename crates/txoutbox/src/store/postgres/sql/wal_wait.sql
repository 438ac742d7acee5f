-- The WAL source says "I am waiting" for every commit to the outbox ($1 relay id, $2 how long
-- the flag lasts in ms): the `wake` trigger then notifies the table's channel.
INSERT INTO {{waiters}} (relay_id, waiting_until, ordered)
VALUES ($1, now() + $2 * interval '1 millisecond', false)
ON CONFLICT (relay_id) DO UPDATE SET waiting_until = EXCLUDED.waiting_until, ordered = false
