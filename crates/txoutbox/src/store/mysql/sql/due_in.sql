-- Milliseconds until the earliest unfinished event is due. Overdue counts as 1 ms overdue: a
-- row written with a huge negative `available_at` would overflow the subtraction.
SELECT CAST(GREATEST(min(GREATEST(available_at, coalesce(locked_until, available_at))), {{now_ms}} - 1) - {{now_ms}} AS SIGNED)
FROM {{table}} WHERE {{unfinished}}
