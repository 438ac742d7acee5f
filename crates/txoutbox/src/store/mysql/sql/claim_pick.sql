-- Unordered: lock up to ? claimable events in seq order, skipping those others hold.
SELECT e.seq {{claimable}}
ORDER BY e.seq LIMIT ? FOR UPDATE SKIP LOCKED
