-- Lock up to ? free or expired partitions, lowest first, skipping those another heartbeat is
-- taking (then partitions_take.sql: MySQL updates no table that a subquery of the same
-- statement reads, and has no `RETURNING`).
SELECT `partition` FROM {{partitions}}
WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= {{now_ms}}
ORDER BY `partition` LIMIT ? FOR UPDATE SKIP LOCKED
