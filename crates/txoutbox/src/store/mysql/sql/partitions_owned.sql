SELECT `partition` FROM {{partitions}} WHERE owner = ? AND lease_until > {{now_ms}} ORDER BY `partition`
