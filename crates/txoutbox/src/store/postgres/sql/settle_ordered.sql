-- The settle of an ordered claim: fenced by partition ownership at the epochs the claim saw
-- ($5: relay id, $9/$10: partitions and their epochs), not by a row lease. A relay that lost a
-- partition changes nothing in it, and neither does one whose partition went to another relay
-- and came back (its epoch moved on meanwhile).
WITH mine AS (
   SELECT p.partition FROM {{partitions}} p
   JOIN unnest($9::int[], $10::bigint[]) AS c(partition, epoch)
     ON c.partition = p.partition AND c.epoch = p.epoch
   WHERE p.owner = $5
),
ok AS ({{published_ordered}}),
bad AS (
   UPDATE {{table}} AS e
   SET {{failed}}
   FROM {{failures}}
   WHERE e.id = f.id AND e.processed_at IS NULL
     AND e.partition_key % $8 = ANY (ARRAY(SELECT partition FROM mine))
   RETURNING 1
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad)
