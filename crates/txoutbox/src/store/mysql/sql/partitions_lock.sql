-- The heartbeat's registration lock: partition 0 always exists; its row lock is the table's.
SELECT `partition` FROM {{partitions}} WHERE `partition` = 0 FOR UPDATE
