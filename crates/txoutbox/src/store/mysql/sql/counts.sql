-- pending, leased, dead, processed, and the age of the oldest unfinished event (seconds).
SELECT
   CAST(coalesce(sum({{unfinished}} AND (locked_until IS NULL OR locked_until <= {{now_ms}})), 0) AS SIGNED),
   CAST(coalesce(sum({{unfinished}} AND locked_until > {{now_ms}}), 0) AS SIGNED),
   CAST(coalesce(sum(dead_at IS NOT NULL AND processed_at IS NULL), 0) AS SIGNED),
   CAST(coalesce(sum(processed_at IS NOT NULL), 0) AS SIGNED),
   (CAST({{now_ms}} AS DOUBLE) - min(CASE WHEN {{unfinished}} THEN created_at END)) / 1000.0
FROM {{table}}
