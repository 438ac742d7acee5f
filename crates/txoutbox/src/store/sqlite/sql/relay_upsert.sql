-- Register or renew relay ?1 (mode ?2, lease ?3 ms, instance ?4).
INSERT INTO {{relays}} (relay_id, mode, instance, heartbeat_at, alive_until)
VALUES (?1, ?2, ?4, {{now_ms}}, {{now_ms}} + ?3)
ON CONFLICT (relay_id) DO UPDATE
SET mode = excluded.mode, instance = excluded.instance,
    heartbeat_at = excluded.heartbeat_at, alive_until = excluded.alive_until
