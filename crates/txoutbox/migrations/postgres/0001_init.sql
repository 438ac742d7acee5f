-- txoutbox schema, version 1.
-- Placeholders (filled with validated, quoted identifiers): {{schema}}, {{table}} (qualified),
-- {{name:SUFFIX}} (a quoted, schema-qualified object named after the table), {{channel}}.

-- A superset of the seed's outbox_events: its literal
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES (...)
-- keeps working unchanged.
CREATE TABLE {{table}} (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- Total order of inserts; the relay claims by it. An identity is unique by construction,
    -- so no full unique index is kept (it would grow with every event ever written).
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    -- Failed delivery attempts so far (the seed's retry counter).
    attempts       integer     NOT NULL DEFAULT 0,
    -- Backoff: not claimable before this (the seed's retry_after).
    available_at   timestamptz NOT NULL DEFAULT now(),
    -- The claim lease, fenced by a per-claim token.
    locked_until   timestamptz,
    locked_by      text,
    lock_token     uuid,
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    processed_at   timestamptz,
    dead_at        timestamptz
);

-- Only pending rows are indexed: the index stays small however many events were published.
CREATE INDEX {{index:pending}} ON {{table}} (seq)
    WHERE processed_at IS NULL AND dead_at IS NULL;

CREATE INDEX {{index:dead}} ON {{table}} (dead_at)
    WHERE dead_at IS NOT NULL AND processed_at IS NULL;

-- Events that will not be retried until an operator acts (`txoutbox dlq`).
CREATE VIEW {{name:dead_letters}} AS
    SELECT * FROM {{table}}
    WHERE dead_at IS NOT NULL AND processed_at IS NULL
    ORDER BY seq;

-- Relays that are idle and waiting for a wake-up. Commits notify only while one is.
CREATE TABLE {{name:waiters}} (
    relay_id      text        PRIMARY KEY,
    waiting_until timestamptz NOT NULL
);

-- One NOTIFY per inserting statement, and only while a relay waits: NOTIFY takes a global
-- lock at commit, so notifying on every commit would cut write throughput by more than half.
-- Identical notifications in one transaction are folded by PostgreSQL.
CREATE FUNCTION {{name:wake}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM {{name:waiters}} WHERE waiting_until > now()) THEN
        PERFORM pg_notify('{{channel}}', '');
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER {{index:wake}} AFTER INSERT ON {{table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{name:wake}}();

-- Consumer-side deduplication (the inbox), shared by all outboxes of the schema.
CREATE TABLE IF NOT EXISTS {{schema}}.processed_events (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
