-- Another live relay of another mode than this one ($1 relay id, $2 mode).
SELECT relay_id, mode FROM {{relays}}
WHERE relay_id <> $1 AND mode <> $2 AND alive_until > now() LIMIT 1
