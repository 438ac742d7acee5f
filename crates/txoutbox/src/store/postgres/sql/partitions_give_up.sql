-- Give up partitions $2 (owned by relay $1).
UPDATE {{partitions}} SET owner = NULL, lease_until = NULL
WHERE owner = $1 AND partition = ANY($2)
