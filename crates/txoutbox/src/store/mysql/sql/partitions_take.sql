-- Take the locked partitions (`{{list}}`: their numbers) for relay ?, leased for ? ms.
UPDATE {{partitions}} SET owner = ?, lease_until = {{now_ms}} + ? WHERE `partition` IN ({{list}})
