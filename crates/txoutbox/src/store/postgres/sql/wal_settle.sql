-- A batch the WAL source read from the stream, settled in one statement before the slot is
-- confirmed past it: the published events ($1), the failed ones ({{failures}}), recorded and
-- handed to the table path, and those held back unattempted ($5 ids, $8 why) because an
-- earlier event of their aggregate waits in the table, handed over too. Only if every one of
-- the batch's transactions ($9 ids) is visible in the statement's snapshot, which its
-- updates share: else nothing changes, and the last column says so.
--
-- Tableless events (logical messages: no row) that failed, were held back or do not decode
-- are written into the table here, handed off ($11..$24, in stream order $25; a row of that
-- id already there, from a settle of the same batch before a restart, is left as it is).
-- A held row that would sort by `seq` ahead of an event of its aggregate that came before it
-- in the stream (a tableless one written now, or a handed-off row of a higher `seq`) is
-- written again behind it, with a new `seq` (in stream order, $10 its position): the table
-- path delivers an aggregate's events in `seq` order.
WITH vis AS ({{visible}}),
ok AS ({{wal_published}}),
bad AS (
   UPDATE {{table}} AS e
   SET {{failed}}, handed_off_at = now()
   FROM {{failures}}
   WHERE e.id = f.id AND e.processed_at IS NULL AND (SELECT * FROM vis)
   RETURNING 1
),
moving AS (
   SELECT e.id FROM {{table}} e
   WHERE e.id = ANY($5) AND e.processed_at IS NULL AND e.handed_off_at IS NULL
     AND (SELECT * FROM vis)
     AND (EXISTS (SELECT 1 FROM unnest($12::text[], $13::text[]) AS n(t, i)
                  WHERE n.t = e.aggregate_type AND n.i = e.aggregate_id)
          OR EXISTS (SELECT 1 FROM {{table}} w
                     WHERE w.aggregate_type = e.aggregate_type
                       AND w.aggregate_id = e.aggregate_id
                       AND w.handed_off_at IS NOT NULL AND w.processed_at IS NULL
                       AND w.seq > e.seq))
),
held AS (
   UPDATE {{table}} SET handed_off_at = now(), last_error = $8
   WHERE id = ANY($5) AND processed_at IS NULL AND handed_off_at IS NULL
     AND id NOT IN (SELECT id FROM moving)
     AND (SELECT * FROM vis)
   RETURNING 1
),
moved AS (
   DELETE FROM {{table}} e USING moving m WHERE e.id = m.id
   RETURNING e.*
),
written AS (
   INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, payload_bytes,
                          content_type, headers, attempts, attempts_unavailable, available_at,
                          created_at, dead_at, last_error, handed_off_at)
   SELECT id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type,
          headers, attempts, attempts_unavailable, available_at, created_at, dead_at,
          last_error, now()
   FROM (
      SELECT m.id, m.aggregate_type, m.aggregate_id, m.event_type, m.payload, m.payload_bytes,
             m.content_type, m.headers, m.attempts, m.attempts_unavailable, m.available_at,
             m.created_at, m.dead_at, $8 AS last_error, h.pos
      FROM moved m JOIN unnest($5::uuid[], $10::bigint[]) AS h(id, pos) ON h.id = m.id
      UNION ALL
      SELECT t.id, t.aggregate_type, t.aggregate_id, t.event_type, t.payload, t.payload_bytes,
             t.content_type, t.headers, t.attempts, t.attempts_unavailable,
             now() + t.delay_ms * interval '1 millisecond', t.created_at,
             CASE WHEN t.dead THEN now() END, t.last_error, t.pos
      FROM unnest($11::uuid[], $12::text[], $13::text[], $14::text[], $15::jsonb[],
                  $16::bytea[], $17::text[], $18::jsonb[], $19::timestamptz[], $20::int[],
                  $21::int[], $22::bigint[], $23::text[], $24::bool[], $25::bigint[])
           AS t(id, aggregate_type, aggregate_id, event_type, payload, payload_bytes,
                content_type, headers, created_at, attempts, attempts_unavailable, delay_ms,
                last_error, dead, pos)
      WHERE (SELECT * FROM vis)
   ) AS s
   ORDER BY pos
   ON CONFLICT (id) DO NOTHING
   RETURNING 1
)
SELECT (SELECT count(*) FROM ok), (SELECT count(*) FROM bad),
       (SELECT count(*) FROM held) + (SELECT count(*) FROM moved),
       (SELECT * FROM vis),
       (SELECT count(*) FROM written) - (SELECT count(*) FROM moved)
