-- The sizes of candidate `e`'s payload that cost no read of the value: as stored (after
-- compression, a lower bound), whether `payload` is compressed, and `payload_bytes`'
-- uncompressed length (from its header).
(coalesce(pg_column_size(e.payload), 0) + coalesce(octet_length(e.payload_bytes), 0))::int8 AS stored,
  pg_column_compression(e.payload) IS NOT NULL AS compressed,
  coalesce(octet_length(e.payload_bytes), 0)::int8 AS raw_bytes
