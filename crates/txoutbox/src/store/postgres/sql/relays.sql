-- The relays registered on the table, with the partitions each owns (`txoutbox status`).
SELECT r.relay_id, r.mode, r.started_at, r.heartbeat_at, r.alive_until > now() AS alive,
       coalesce(array_agg(p.partition ORDER BY p.partition)
                FILTER (WHERE p.partition IS NOT NULL), '{}') AS partitions
FROM {{relays}} r
LEFT JOIN {{partitions}} p ON p.owner = r.relay_id AND p.lease_until > now()
GROUP BY r.relay_id
ORDER BY r.started_at
