-- Ordered, a plain read (locked afterwards: claim_lock.sql): claimable events with their
-- aggregates, in the partitions (of ? in all) relay ? owns with a margin on the lease, with
-- no earlier event of their aggregate backing off, leased or (with ?, `hold`) dead; at most ?;
-- with their payloads' sizes (the claim keeps what fits its byte budget).
SELECT e.seq, e.aggregate_type, e.aggregate_id, {{payload_size}} AS size {{claimable}}
  AND MOD(e.partition_key, ?) IN (
      SELECT `partition` FROM {{partitions}}
      WHERE owner = ? AND lease_until > {{now_ms}} + {{claim_margin_ms}})
  AND NOT EXISTS (
      SELECT 1 FROM {{table}} b
      WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
        AND b.processed_at IS NULL AND b.seq < e.seq
        AND ((b.dead_at IS NULL AND (b.available_at > {{now_ms}} OR b.locked_until > {{now_ms}}))
             OR (b.dead_at IS NOT NULL AND ?)))
ORDER BY e.seq LIMIT ?
