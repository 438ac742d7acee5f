-- Unordered: lock up to ? claimable events in seq order, skipping those others hold, with
-- their payloads' sizes (the claim keeps what fits its byte budget).
SELECT e.seq, {{payload_size}} AS size {{claimable}}
ORDER BY e.seq LIMIT ? FOR UPDATE SKIP LOCKED
