-- Take up to $3 free or expired partitions for relay $1 (lease $2 ms), lowest first, skipping
-- those another heartbeat is taking. A new owner bumps the partition's epoch: claims fenced
-- by the old epoch fail.
UPDATE {{partitions}} SET owner = $1, lease_until = now() + $2 * interval '1 millisecond',
    epoch = epoch + 1
WHERE partition IN (
   SELECT partition FROM {{partitions}}
   WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= now()
   ORDER BY partition LIMIT $3
   FOR UPDATE SKIP LOCKED
)
RETURNING partition
