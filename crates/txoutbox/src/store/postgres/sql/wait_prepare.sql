-- Say "I am waiting" (writers notify only then) and learn, in the same round trip, how long
-- until the earliest event this relay can take is due ($4: how long the flag lasts; the rest
-- as in due.sql). An ordered relay waits for its own partitions only: commits to others' do
-- not notify (see the `wake` trigger).
WITH w AS (
   INSERT INTO {{waiters}} (relay_id, waiting_until, ordered)
   VALUES ($1, now() + $4 * interval '1 millisecond', $2)
   ON CONFLICT (relay_id) DO UPDATE
     SET waiting_until = EXCLUDED.waiting_until, ordered = EXCLUDED.ordered
)
{{due}}
