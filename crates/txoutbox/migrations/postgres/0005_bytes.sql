-- txoutbox schema, version 5: binary payloads. An event carries JSON in `payload`, as the
-- seed writes it, or bytes (Protobuf, Avro, ...) in `payload_bytes` with their
-- `content_type`, and then `payload` is the JSON null:
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type)
--   VALUES ('order', '42', 'order.created', 'null', '\x082a'::bytea, 'application/x-protobuf');
ALTER TABLE {{table}}
    ADD COLUMN payload_bytes bytea,
    ADD COLUMN content_type text;

-- One payload or the other. NOT VALID skips the scan of the existing rows, which cannot break
-- it (both new columns are NULL in them); new and updated rows are checked all the same.
ALTER TABLE {{table}} ADD CONSTRAINT {{index:payload_kind}} CHECK (
    (payload_bytes IS NULL AND content_type IS NULL)
    OR (payload_bytes IS NOT NULL AND content_type IS NOT NULL AND payload = 'null'::jsonb)
) NOT VALID;

-- The view's `*` was expanded when it was made: take the new columns in.
CREATE OR REPLACE VIEW {{name:dead_letters}} AS
    SELECT * FROM {{table}}
    WHERE dead_at IS NOT NULL AND processed_at IS NULL
    ORDER BY seq;
