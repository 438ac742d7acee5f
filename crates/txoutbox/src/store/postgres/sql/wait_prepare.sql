-- Say "I am waiting" (writers notify only then) and learn, in the same round trip, how long
-- until the earliest event this relay can take is due ($3: how long the flag lasts; $1 and
-- $2 as in due.sql). A relay that owns partitions (or is ordered) waits for its own
-- partitions only: commits to others' do not notify (see the `wake` trigger).
WITH w AS (
   INSERT INTO {{waiters}} (relay_id, waiting_until, ordered)
   VALUES ($1, now() + $3 * interval '1 millisecond', $2 > 0 OR EXISTS (
     SELECT 1 FROM {{partitions}} WHERE owner = $1 AND lease_until > now()))
   ON CONFLICT (relay_id) DO UPDATE
     SET waiting_until = EXCLUDED.waiting_until, ordered = EXCLUDED.ordered
)
{{due}}
