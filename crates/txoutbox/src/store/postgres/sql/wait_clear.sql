DELETE FROM {{waiters}} WHERE relay_id = $1
