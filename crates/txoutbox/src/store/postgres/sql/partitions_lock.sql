-- The heartbeat's registration lock: conflicts with itself and with writes, not with readers
-- (`txoutbox status`).
LOCK TABLE {{relays}} IN SHARE ROW EXCLUSIVE MODE
