-- Another live relay of another mode than this one (relay id, mode).
SELECT relay_id, mode FROM {{relays}}
WHERE relay_id <> ? AND mode <> ? AND alive_until > {{now_ms}} LIMIT 1
