-- Several tableless events in one statement, in slice order (the sorted subquery is not
-- flattened, so the function runs row after row in that order).
SELECT count({{emit_event}}(id, aggregate_type, aggregate_id, event_type, payload,
                            payload_bytes, content_type, headers))
FROM (SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[],
                           $6::bytea[], $7::text[], $8::jsonb[])
        WITH ORDINALITY AS e(id, aggregate_type, aggregate_id, event_type, payload,
                             payload_bytes, content_type, headers, n)
      ORDER BY n) AS e
