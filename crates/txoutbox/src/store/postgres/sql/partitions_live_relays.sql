SELECT count(*) FROM {{relays}} WHERE mode = $1 AND alive_until > now()
