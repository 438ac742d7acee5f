-- The database side of a drain, without a relay: claim 500 + settle 500 in a loop until the
-- table is drained, each statement its own transaction. run_a: the row-lease claim (UPDATE) +
-- settle (UPDATE); run_b(n, false): a read-only ordered claim + settle UPDATE; run_b(n, true):
-- read-only claim + settle DELETE.
CREATE OR REPLACE PROCEDURE exp.run_a(n int) LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; tok uuid; total int := 0; t0 timestamptz := clock_timestamp();
BEGIN
  LOOP
    tok := gen_random_uuid();
    WITH c AS (
      SELECT e.id FROM exp.o e
      WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now()
        AND (e.locked_until IS NULL OR e.locked_until <= now())
        AND NOT EXISTS (SELECT 1 FROM exp.o b WHERE b.partition_key = e.partition_key AND b.seq < e.seq
            AND b.processed_at IS NULL AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
            AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
            AND ((b.dead_at IS NULL AND (b.available_at > now() OR b.locked_until > now()))) OFFSET 0)
      ORDER BY e.seq LIMIT n FOR UPDATE SKIP LOCKED)
    , u AS (UPDATE exp.o e SET locked_until = now() + interval '30 s', locked_by = 'r', lock_token = tok FROM c WHERE e.id = c.id RETURNING e.id)
    SELECT array_agg(id) INTO ids FROM u;
    COMMIT;
    EXIT WHEN ids IS NULL;
    UPDATE exp.o SET processed_at = now(), locked_until = NULL, locked_by = NULL, lock_token = NULL, last_error = NULL WHERE id = ANY(ids) AND lock_token = tok;
    COMMIT;
    total := total + cardinality(ids);
  END LOOP;
  RAISE NOTICE 'row-lease claim + UPDATE settle:     % rows in % s = % rows/s', total, extract(epoch from clock_timestamp()-t0), round(total / extract(epoch from clock_timestamp()-t0));
END $$;

CREATE OR REPLACE PROCEDURE exp.run_b(n int, del bool) LANGUAGE plpgsql AS $$
DECLARE ids uuid[]; total int := 0; t0 timestamptz := clock_timestamp();
BEGIN
  LOOP
    SELECT array_agg(id) INTO ids FROM (
      SELECT e.id FROM exp.o e
      WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= now()
        AND NOT EXISTS (SELECT 1 FROM exp.o b WHERE b.partition_key = e.partition_key AND b.seq < e.seq
            AND b.processed_at IS NULL AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
            AND b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
            AND ((b.dead_at IS NULL AND (b.available_at > now() OR b.locked_until > now()))) OFFSET 0)
      ORDER BY e.seq LIMIT n) c;
    COMMIT;
    EXIT WHEN ids IS NULL;
    IF del THEN
      DELETE FROM exp.o WHERE id = ANY(ids);
    ELSE
      UPDATE exp.o SET processed_at = now(), last_error = NULL WHERE id = ANY(ids);
    END IF;
    COMMIT;
    total := total + cardinality(ids);
  END LOOP;
  RAISE NOTICE 'read-only claim + % settle: % rows in % s = % rows/s', CASE WHEN del THEN 'DELETE' ELSE 'UPDATE' END, total, extract(epoch from clock_timestamp()-t0), round(total / extract(epoch from clock_timestamp()-t0));
END $$;
