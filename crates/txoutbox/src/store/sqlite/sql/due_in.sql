-- Milliseconds until the earliest unfinished event is due (negative: overdue).
SELECT min(max(available_at, coalesce(locked_until, available_at))) - {{now_ms}}
FROM {{table}} WHERE {{unfinished}}
