-- The events a claim picks from: unfinished, due and not leased.
FROM {{table}} e
WHERE e.processed_at IS NULL AND e.dead_at IS NULL AND e.available_at <= {{now_ms}}
  AND (e.locked_until IS NULL OR e.locked_until <= {{now_ms}})
