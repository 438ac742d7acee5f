-- The relay registered on this file (at most one alive).
SELECT relay_id, mode, started_at, heartbeat_at, alive_until > {{now_ms}} AS alive
FROM {{relays}} ORDER BY started_at
