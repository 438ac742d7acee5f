DELETE FROM {{relays}} WHERE relay_id = ?1
