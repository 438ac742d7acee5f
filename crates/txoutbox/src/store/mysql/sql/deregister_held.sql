-- Is relay id ? held by another process (not instance ?)? Locks its row.
SELECT 1 FROM {{relays}} WHERE relay_id = ? AND NOT (instance <=> ?) FOR UPDATE
