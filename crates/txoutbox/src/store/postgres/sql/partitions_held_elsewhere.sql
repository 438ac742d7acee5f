-- Seconds left on relay id $1 if another live process (not instance $2) holds it.
SELECT extract(epoch FROM alive_until - now())::float8 FROM {{relays}}
WHERE relay_id = $1 AND alive_until > now() AND instance IS DISTINCT FROM $2
