-- Seconds until the earliest event this relay can take is due ($1: relay id, $2: its mode, 0
-- unordered, 1 ordered, 2 ordered with `hold`). Only events in the partitions it owns, one
-- probe of the partition index each (an idle relay beside another relay's backlog reads
-- nothing); ordered, only those that no earlier event of their aggregate holds back (backing
-- off or leased: that one's own due time counts; dead, with `hold`: it waits for an operator,
-- whose retry wakes the relay). An unordered relay that owns no partition (it leases rows,
-- claim.sql): any unfinished event of a partition no live relay owns. Rows it could never
-- claim (other relays' partitions, events behind a held one) would make an idle relay's wait
-- return "ready" at once, over and over. As a difference of epochs: a row written with
-- `available_at = 'infinity'` makes it Infinity, where subtracting timestamps fails ("cannot
-- subtract infinite timestamps") and would stop the relay.
SELECT (extract(epoch FROM min(t)) - extract(epoch FROM now()))::float8 FROM (
  SELECT greatest(e.available_at, coalesce(e.locked_until, e.available_at)) AS t
  FROM {{table}} e WHERE $2 = 0 AND e.processed_at IS NULL AND e.dead_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM {{partitions}} WHERE owner = $1 AND lease_until > now())
    AND NOT EXISTS (SELECT 1 FROM {{partitions}} o WHERE o.partition = (e.partition_key & 63)
                    AND o.owner IS NOT NULL AND o.lease_until > now())
  UNION ALL
  SELECT d.t FROM {{partitions}} p CROSS JOIN LATERAL (
    SELECT greatest(e.available_at, coalesce(e.locked_until, e.available_at)) AS t
    FROM {{table}} e
    WHERE (e.partition_key & 63) = p.partition
      AND e.processed_at IS NULL AND e.dead_at IS NULL
      AND ($2 = 0 OR NOT EXISTS (
        SELECT 1 FROM {{table}} b
        WHERE b.partition_key = e.partition_key AND b.seq < e.seq
          AND {{blocking}}
          AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
          AND (b.dead_at IS NULL OR $2 = 2)
        OFFSET 0))
  ) d
  WHERE p.owner = $1 AND p.lease_until > now()
) due
