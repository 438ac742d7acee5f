UPDATE {{partitions}} SET owner = NULL, lease_until = NULL WHERE owner = ?
