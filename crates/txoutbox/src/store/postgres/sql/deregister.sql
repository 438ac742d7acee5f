-- Only while no other instance holds the relay id ($2: this one's): the exit of a process that
-- was refused, or found another holding its id, strips nobody.
WITH me AS (
   SELECT $1::text AS relay_id WHERE NOT EXISTS (
     SELECT 1 FROM {{relays}} WHERE relay_id = $1 AND instance IS DISTINCT FROM $2)
),
w AS (DELETE FROM {{waiters}} WHERE relay_id IN (SELECT relay_id FROM me)),
p AS (UPDATE {{partitions}} SET owner = NULL, lease_until = NULL
      WHERE owner IN (SELECT relay_id FROM me)),
r AS (DELETE FROM {{relays}} WHERE relay_id IN (SELECT relay_id FROM me))
UPDATE {{table}} SET locked_until = NULL, locked_by = NULL, lock_token = NULL
WHERE {{unfinished}} AND locked_by IN (SELECT relay_id FROM me)
