-- txoutbox schema, version 6: tableless events. An event written as a transactional logical
-- message (`pg_logical_emit_message(true, ...)`) instead of a row: it commits or rolls back with
-- the writer's transaction, costs no row, no index entry and no dead tuple, and only the WAL
-- source (`txoutbox relay --source wal`) delivers it, in commit order among the table's events.
-- What it gives up: a lost replication slot loses the tableless events it had not confirmed
-- (there is no row to fall back to); the relay reports such a gap (docs/wal.md).
--
-- Any writer can emit one with plain SQL, in its own transaction:
--   SELECT outbox_emit('order', '42', 'order.created', '{"total": 3}');
--   SELECT outbox_emit_bytes('order', '42', 'order.created', '\x082a', 'application/x-protobuf');
-- (the schema's `outbox_events` gives `outbox_emit`; another table `t` gives `t_emit`).
--
-- The message's prefix names the outbox, `txoutbox:<schema>.<table>`, so a relay takes its own
-- outbox's messages only. Its content, version 1, every integer big-endian:
--   1 byte   the version (1)
--   16 bytes the event id (uuid)
--   8 bytes  created_at (microseconds since 2000-01-01 UTC, timestamptz's binary format)
--   then six fields, each an Int32 length (-1: NULL) and that many bytes: aggregate_type,
--   aggregate_id, event_type (UTF-8), headers (a JSON object, as jsonb prints it),
--   content_type (NULL for a JSON payload), payload (the JSON as jsonb prints it, or the bytes).
-- The library's `Outbox::emit` calls the same functions, so both write the same content.

CREATE FUNCTION {{name:emit_event}}(
    id uuid, aggregate_type text, aggregate_id text, event_type text, payload jsonb,
    payload_bytes bytea, content_type text, headers jsonb
) RETURNS uuid LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    body bytea;
    h jsonb := coalesce(headers, '{}'::jsonb);
BEGIN
    IF id IS NULL OR aggregate_type IS NULL OR aggregate_id IS NULL OR event_type IS NULL THEN
        RAISE EXCEPTION 'a tableless event needs its id, aggregate_type, aggregate_id and event_type'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF payload_bytes IS NULL AND (payload IS NULL OR content_type IS NOT NULL) THEN
        RAISE EXCEPTION 'a tableless event needs a JSON payload, or bytes with their content type'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF payload_bytes IS NOT NULL AND content_type IS NULL THEN
        RAISE EXCEPTION 'a tableless event of bytes needs its content type'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(h) <> 'object' THEN
        RAISE EXCEPTION 'the headers of a tableless event must be a JSON object, not %', jsonb_typeof(h)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    body := '\x01'::bytea || uuid_send(id) || timestamptz_send(now())
        || int4send(octet_length(convert_to(aggregate_type, 'UTF8'))) || convert_to(aggregate_type, 'UTF8')
        || int4send(octet_length(convert_to(aggregate_id, 'UTF8'))) || convert_to(aggregate_id, 'UTF8')
        || int4send(octet_length(convert_to(event_type, 'UTF8'))) || convert_to(event_type, 'UTF8')
        || int4send(octet_length(convert_to(h::text, 'UTF8'))) || convert_to(h::text, 'UTF8');
    IF payload_bytes IS NULL THEN
        body := body || int4send(-1)
            || int4send(octet_length(convert_to(payload::text, 'UTF8'))) || convert_to(payload::text, 'UTF8');
    ELSE
        body := body || int4send(octet_length(convert_to(content_type, 'UTF8'))) || convert_to(content_type, 'UTF8')
            || int4send(octet_length(payload_bytes)) || payload_bytes;
    END IF;
    PERFORM pg_logical_emit_message(true, '{{tableless_prefix}}', body);
    RETURN id;
END
$fn$;

CREATE FUNCTION {{name:emit}}(
    aggregate_type text, aggregate_id text, event_type text, payload jsonb,
    headers jsonb DEFAULT '{}', id uuid DEFAULT gen_random_uuid()
) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
    SELECT {{name:emit_event}}(id, aggregate_type, aggregate_id, event_type, payload, NULL, NULL, headers)
$fn$;

CREATE FUNCTION {{name:emit_bytes}}(
    aggregate_type text, aggregate_id text, event_type text, payload bytea, content_type text,
    headers jsonb DEFAULT '{}', id uuid DEFAULT gen_random_uuid()
) RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
    SELECT {{name:emit_event}}(id, aggregate_type, aggregate_id, event_type, 'null', payload, content_type, headers)
$fn$;

COMMENT ON FUNCTION {{name:emit}}(text, text, text, jsonb, jsonb, uuid) IS
    'Emit a tableless event (JSON payload) of the outbox {{table}} in the current transaction; only the WAL source delivers it.';
COMMENT ON FUNCTION {{name:emit_bytes}}(text, text, text, bytea, text, jsonb, uuid) IS
    'Emit a tableless event (bytes payload) of the outbox {{table}} in the current transaction; only the WAL source delivers it.';
