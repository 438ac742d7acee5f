-- Another live relay, or this relay id (?1) held by another process (?2: instance): its id
-- and the milliseconds left on its lease.
SELECT relay_id, alive_until - {{now_ms}} FROM {{relays}}
WHERE (relay_id <> ?1 OR instance IS NOT ?2) AND alive_until > {{now_ms}}
ORDER BY relay_id = ?1 DESC LIMIT 1
