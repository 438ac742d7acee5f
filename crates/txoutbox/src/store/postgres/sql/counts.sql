-- pending, leased, dead, processed, and the age of the oldest unfinished event (seconds).
SELECT
   count(*) FILTER (WHERE {{unfinished}} AND (locked_until IS NULL OR locked_until <= now())),
   count(*) FILTER (WHERE {{unfinished}} AND locked_until > now()),
   count(*) FILTER (WHERE dead_at IS NOT NULL AND processed_at IS NULL),
   count(*) FILTER (WHERE processed_at IS NOT NULL),
   extract(epoch FROM now() - min(created_at) FILTER (WHERE {{unfinished}} AND isfinite(created_at)))::float8
FROM {{table}}
