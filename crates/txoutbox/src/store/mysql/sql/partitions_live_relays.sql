SELECT count(*) FROM {{relays}} WHERE mode = ? AND alive_until > {{now_ms}}
