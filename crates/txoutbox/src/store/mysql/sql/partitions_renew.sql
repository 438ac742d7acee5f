-- Extend the lease (ms) of the partitions relay ? still owns (no `RETURNING`: then
-- partitions_owned.sql).
UPDATE {{partitions}} SET lease_until = {{now_ms}} + ? WHERE owner = ? AND lease_until > {{now_ms}}
