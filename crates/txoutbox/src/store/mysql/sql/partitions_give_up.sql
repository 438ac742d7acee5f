-- Give up partitions (`{{list}}`: their numbers) owned by relay ?.
UPDATE {{partitions}} SET owner = NULL, lease_until = NULL
WHERE owner = ? AND `partition` IN ({{list}})
