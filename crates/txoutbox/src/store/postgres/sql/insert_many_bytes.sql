-- Several events in one statement, `WITH ORDINALITY` keeping `seq` in slice order.
INSERT INTO {{table}} ({{insert_columns_bytes}}) SELECT {{insert_columns_bytes}}
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[],
            $7::bytea[], $8::text[])
  WITH ORDINALITY AS e({{insert_columns_bytes}}, n)
ORDER BY n
