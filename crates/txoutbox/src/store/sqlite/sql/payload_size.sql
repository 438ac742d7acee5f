-- The payload's size in bytes (read from the record header, not the value).
(coalesce(octet_length(e.payload), 0) + coalesce(octet_length(e.payload_bytes), 0))
