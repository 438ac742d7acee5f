-- The relays registered on the table, with the partitions each owns (`txoutbox status`).
SELECT r.relay_id, r.mode, r.started_at, r.heartbeat_at,
       CAST(r.alive_until > {{now_ms}} AS SIGNED) AS alive,
       CAST(GROUP_CONCAT(p.`partition` ORDER BY p.`partition`) AS CHAR) AS parts
FROM {{relays}} r
LEFT JOIN {{partitions}} p ON p.owner = r.relay_id AND p.lease_until > {{now_ms}}
GROUP BY r.relay_id, r.mode, r.started_at, r.heartbeat_at, r.alive_until
ORDER BY r.started_at
