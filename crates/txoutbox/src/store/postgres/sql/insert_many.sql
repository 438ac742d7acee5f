-- Several events in one statement, `WITH ORDINALITY` keeping `seq` in slice order.
INSERT INTO {{table}} ({{insert_columns}}) SELECT {{insert_columns}}
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[])
  WITH ORDINALITY AS e({{insert_columns}}, n)
ORDER BY n
