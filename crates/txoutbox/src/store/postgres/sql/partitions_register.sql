-- Insert or refresh this relay's row ($1 relay id, $2 mode, $3 lease in ms, $4 instance).
INSERT INTO {{relays}} (relay_id, mode, instance, heartbeat_at, alive_until)
VALUES ($1, $2, $4, now(), now() + $3 * interval '1 millisecond')
ON CONFLICT (relay_id) DO UPDATE
SET mode = EXCLUDED.mode, instance = EXCLUDED.instance, heartbeat_at = now(),
    alive_until = EXCLUDED.alive_until
