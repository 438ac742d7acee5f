-- Ordered: only partitions this relay owns under a live lease (with a margin, so a claim never
-- overlaps a takeover), only events of aggregates this relay has no event of in flight ($5:
-- their partition keys, looked up in a hashed subplan: a plain `<> ALL ($5)` compared each
-- candidate with every key, up to a thousand), at most $6 (while batches are in flight, a few
-- batches past the last event in flight: when every aggregate is in flight, a claim ahead would
-- otherwise read the whole backlog to find nothing), and only events with no earlier event of
-- their aggregate backing off, leased (by an unordered relay of old) or (with $4, `hold`) dead.
-- Together with one owner per partition, this keeps each aggregate's events in seq order. It
-- writes nothing: the partition lease is the claim, and the settle is fenced by partition
-- ownership and epoch. `lease_left` (on one row only, with the fence) is how long the
-- shortest of the partition leases still runs. The walk of the pending index runs only if one
-- of the owned partitions has an event available at all (an InitPlan, one probe of the
-- partition index per partition): the empty claim of an idle relay beside another relay's
-- backlog costs next to nothing.
-- Up to the byte budget (within_bytes.sql; an event over the per-event ceiling comes without
-- its payload, and its size: the claim dead-letters it).
-- Events of this relay's claims in flight that the broker already acknowledged ($9, $10: their
-- seqs as runs from $9[i] to $10[i], a batch's usually one or two, expanded into a hashed
-- subplan) are skipped, not held back on: their settle is on its way, and their aggregates'
-- next events may go (Claim::acknowledged).
-- $1 limit, $2 relay id, $3 partition count, $7 the byte budget, $8 the per-event ceiling.
WITH RECURSIVE lim AS (SELECT $7::int8 AS batch, $8::int8 AS event),
owned AS (
   SELECT partition, lease_until, epoch FROM {{partitions}}
   WHERE owner = $2 AND lease_until > now() + interval '{{claim_margin_ms}} milliseconds'
),
c AS (
SELECT e.id, e.seq, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.payload_bytes, e.content_type,
  {{stored_size}}, e.headers, e.attempts, e.attempts_unavailable, e.available_at, e.created_at,
  e.processed_at, e.dead_at, e.locked_by, e.locked_until, e.last_error, e.partition_key
FROM {{table}} e
WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now()
  AND (e.locked_until IS NULL OR e.locked_until <= now())
  AND e.partition_key % $3 = ANY (ARRAY(SELECT partition FROM owned))
  AND e.seq <= $6
  AND e.partition_key NOT IN (SELECT unnest($5::int[]))
  AND e.seq NOT IN (SELECT generate_series(r.lo, r.hi) FROM unnest($9::int8[], $10::int8[]) AS r (lo, hi))
  AND EXISTS (SELECT 1 FROM owned o WHERE EXISTS (
    SELECT 1 FROM {{table}} x
    WHERE (x.partition_key & 63) = o.partition
      AND x.processed_at IS NULL AND x.dead_at IS NULL AND x.available_at <= now()
      AND (x.locked_until IS NULL OR x.locked_until <= now())))
  -- While the blocking index is empty (nothing failed, nothing leased, no dead letter: the
  -- usual case) nothing can hold a candidate back, and one probe of it (an InitPlan) stands
  -- for one per candidate, a seventh of the claim's time.
  AND (NOT EXISTS (SELECT 1 FROM {{table}} b WHERE {{blocking}}) OR NOT EXISTS (
    SELECT 1 FROM {{table}} b
    WHERE b.partition_key = e.partition_key AND b.seq < e.seq
      AND {{blocking}}
      AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
      AND ((b.dead_at IS NULL AND (b.available_at > now() OR b.locked_until > now()))
           OR (b.dead_at IS NOT NULL AND $4))
    OFFSET 0
  ))
ORDER BY e.seq
LIMIT $1
),
{{within_bytes}},
-- The lease left and the fence are the claim's, not each event's: they come with the lowest
-- seq's row only (two arrays of 64 on each of 500 rows were most of what a claim sent).
-- The rows come in no particular order: the relay puts the events in seq order
-- (undecodable.rs `split`), and finds the head's row (claim.rs `read_claim`). Sorting 500 wide
-- rows here, and merging the head in by seq, was a seventh of the statement's time.
head AS (
  SELECT min(c.seq) AS seq,
    extract(epoch FROM (SELECT min(lease_until) FROM owned) - now())::float8 AS lease_left,
    (SELECT array_agg(partition ORDER BY partition) FROM owned) AS fence_partitions,
    (SELECT array_agg(epoch ORDER BY partition) FROM owned) AS fence_epochs
  FROM c
),
-- Usually every candidate fits (`fast`): the candidates go out as they are, with no join.
sized AS (
  SELECT c.*, c.stored AS size FROM c WHERE (SELECT fits FROM fast)
  UNION ALL
  SELECT c.*, b.size FROM c JOIN b ON b.id = c.id WHERE NOT (SELECT fits FROM fast)
)
SELECT s.id, s.seq, s.aggregate_type, s.aggregate_id, s.event_type,
  CASE WHEN s.size > $8 THEN NULL ELSE s.payload END AS payload,
  CASE WHEN s.size > $8 THEN NULL ELSE s.payload_bytes END AS payload_bytes, s.content_type,
  s.headers, s.attempts, s.attempts_unavailable, s.available_at, s.created_at, s.processed_at,
  s.dead_at, s.locked_by, s.locked_until, s.last_error, s.partition_key,
  CASE WHEN s.seq = h.seq THEN h.lease_left END AS lease_left,
  CASE WHEN s.seq = h.seq THEN h.fence_partitions END AS fence_partitions,
  CASE WHEN s.seq = h.seq THEN h.fence_epochs END AS fence_epochs, s.size AS payload_size
FROM sized s CROSS JOIN head h
