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
    -- How many of those failed because the broker was unavailable: they back off but do not
    -- count towards max_attempts, so an outage does not use up an event's retry budget.
    attempts_unavailable integer NOT NULL DEFAULT 0,
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

-- Wake a waiting relay when an inserting transaction commits. The trigger is deferred, so
-- the waiters table is read at commit time: a transaction that inserted before a relay went
-- to sleep and commits after still wakes it. It notifies only while a relay waits (NOTIFY
-- takes a global lock at commit: notifying on every commit would cut write throughput by more
-- than half), and only once per transaction (a transaction-local setting guards the rest of
-- its rows).
CREATE FUNCTION {{name:wake}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('txoutbox.woke', true) = '{{channel}}' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('txoutbox.woke', '{{channel}}', true);
    IF EXISTS (SELECT 1 FROM {{name:waiters}} WHERE waiting_until > now()) THEN
        PERFORM pg_notify('{{channel}}', '');
    END IF;
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER {{index:wake}} AFTER INSERT ON {{table}}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{name:wake}}();

-- Consumer-side deduplication (the inbox), shared by all outboxes of the schema.
CREATE TABLE IF NOT EXISTS {{schema}}.processed_events (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
