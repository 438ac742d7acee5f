-- The payload's size in bytes.
CAST(coalesce(length(e.payload), 0) + coalesce(length(e.payload_bytes), 0) AS SIGNED)
