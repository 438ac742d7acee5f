-- Are all of these 32-bit transaction ids ({{xids}}, bigint[]) visible in the statement's
-- snapshot? Each is widened to its 64-bit id by the snapshot's epoch (the one before, if it is
-- above the snapshot's xmax: it came before a wraparound).
SELECT coalesce(bool_and(pg_visible_in_snapshot(
         ((((m.xmax >> 32) - CASE WHEN t.xid > (m.xmax & 4294967295) THEN 1 ELSE 0 END) << 32)
          | t.xid)::text::xid8, m.snap)), true)
FROM (SELECT s AS snap, pg_snapshot_xmax(s)::text::bigint AS xmax
      FROM pg_current_snapshot() AS s) AS m,
     unnest({{xids}}::bigint[]) AS t(xid)
