-- Is relay id ?1 held by another process (not instance ?2)?
SELECT 1 FROM {{relays}} WHERE relay_id = ?1 AND instance IS NOT ?2
