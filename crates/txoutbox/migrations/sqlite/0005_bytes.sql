-- txoutbox schema, version 5: binary payloads. An event carries JSON in `payload`, as the
-- seed writes it, or bytes (Protobuf, Avro, ...) in `payload_bytes` with their
-- `content_type`, and then `payload` is the JSON null:
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type)
--   VALUES ('order', '42', 'order.created', 'null', X'082A', 'application/x-protobuf');
ALTER TABLE {{table}} ADD COLUMN payload_bytes BLOB;

-- One payload or the other (SQLite adds a constraint only with a column).
ALTER TABLE {{table}} ADD COLUMN content_type TEXT CHECK (
    (payload_bytes IS NULL AND content_type IS NULL)
    OR (payload_bytes IS NOT NULL AND content_type IS NOT NULL AND json(payload) = 'null')
);
