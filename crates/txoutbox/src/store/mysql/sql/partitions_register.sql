-- Insert or refresh this relay's row (relay id, mode, instance, lease in ms).
INSERT INTO {{relays}} (relay_id, mode, instance, heartbeat_at, alive_until)
VALUES (?, ?, ?, {{now_ms}}, {{now_ms}} + ?)
ON DUPLICATE KEY UPDATE mode = VALUES(mode), instance = VALUES(instance),
    heartbeat_at = VALUES(heartbeat_at), alive_until = VALUES(alive_until)
