-- Lease up to ?1 claimable events in seq order for ?2 ms to relay ?3 under token ?4, in one
-- statement that takes the write lock up front (claims never overlap). A text or blob
-- `available_at` (plain SQL can write one) sorts after every number and would never be due:
-- it is claimed, so that the claim dead-letters it. `{{ordered}}` and `{{relay_lease}}`: the
-- conditions of an ordered claim (claim_ordered_blocked.sql, claim_relay_lease.sql), or none.
-- Byte budget: the first event whatever its size, then those whose running total of payload
-- bytes stays within ?6; an event over ?7 bytes comes without its payload, and its size (the
-- claim dead-letters it).
UPDATE {{table}} SET locked_until = {{now_ms}} + ?2, locked_by = ?3, lock_token = ?4
WHERE seq IN (
   SELECT seq FROM (
      SELECT c.seq, sum(c.size) OVER (ORDER BY c.seq) AS upto,
        row_number() OVER (ORDER BY c.seq) AS n
      FROM (
         SELECT e.seq, {{payload_size}} AS size FROM {{table}} e
         WHERE e.processed_at IS NULL AND e.dead_at IS NULL
           AND (e.available_at <= {{now_ms}} OR typeof(e.available_at) IN ('text', 'blob'))
           AND (e.locked_until IS NULL OR e.locked_until <= {{now_ms}}) {{ordered}}
         ORDER BY e.seq LIMIT ?1
      ) c
   ) WHERE n = 1 OR upto <= ?6
) {{relay_lease}}
RETURNING {{capped_columns}}
