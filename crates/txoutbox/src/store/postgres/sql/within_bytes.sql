-- The claim's prefix within its byte budget, as common table expressions after `lim` (batch:
-- the budget) and the candidates `c` (id, seq, and the sizes of stored_size.sql), ending
-- with `b` (id, size): the first candidate whatever its size, then those whose running total
-- stays within the budget (the statement needs WITH RECURSIVE). When no candidate is
-- compressed and all fit (the usual case), that is every candidate, read from their headers
-- alone. Otherwise the candidates are walked in seq order, measuring a compressed value as
-- its text, until the budget is passed: a value that compresses well counts whole, and no
-- more than one value past the budget is measured.
fast AS (
  SELECT coalesce(bool_and(NOT c.compressed) AND sum(c.stored) <= (SELECT batch FROM lim), true)
    AS fits
  FROM c
),
o AS MATERIALIZED (
  SELECT array_agg(c.id ORDER BY c.seq) AS ids, array_agg(c.stored ORDER BY c.seq) AS stored,
    array_agg(c.compressed ORDER BY c.seq) AS compressed,
    array_agg(c.raw_bytes ORDER BY c.seq) AS raw, count(*) AS total
  FROM c WHERE NOT (SELECT fits FROM fast)
),
r (n, id, size, upto) AS (
  SELECT 1, o.ids[1], m.size, m.size
  FROM o CROSS JOIN LATERAL (SELECT CASE WHEN o.compressed[1]
    THEN (SELECT octet_length(x.payload::text) FROM {{table}} x WHERE x.id = o.ids[1]) + o.raw[1]
    ELSE o.stored[1] END::int8 AS size) m
  WHERE o.total > 0
  UNION ALL
  SELECT r.n + 1, o.ids[r.n + 1], m.size, r.upto + m.size
  FROM r CROSS JOIN o CROSS JOIN LATERAL (SELECT CASE WHEN o.compressed[r.n + 1]
    THEN (SELECT octet_length(x.payload::text) FROM {{table}} x WHERE x.id = o.ids[r.n + 1])
      + o.raw[r.n + 1]
    ELSE o.stored[r.n + 1] END::int8 AS size) m
  WHERE r.n < o.total AND r.upto <= (SELECT batch FROM lim)
),
b AS MATERIALIZED (
  SELECT c.id, c.stored AS size FROM c WHERE (SELECT fits FROM fast)
  UNION ALL
  SELECT r.id, r.size FROM r WHERE r.n = 1 OR r.upto <= (SELECT batch FROM lim)
)
