-- Extend the lease ($2 ms) of the partitions relay $1 still owns; returns them.
UPDATE {{partitions}} SET lease_until = now() + $2 * interval '1 millisecond'
WHERE owner = $1 AND lease_until > now() RETURNING partition
