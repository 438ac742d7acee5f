-- Milliseconds left on relay id ? if another live process (not instance ?) holds it.
SELECT alive_until - {{now_ms}} FROM {{relays}}
WHERE relay_id = ? AND alive_until > {{now_ms}} AND NOT (instance <=> ?)
