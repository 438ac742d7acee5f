-- txoutbox schema for SQLite, version 1: the same columns as on PostgreSQL, with types
-- adapted. Placeholders: {{table}}, {{name:SUFFIX}} (an object named after the table),
-- {{now_ms}} (the current time as integer milliseconds since the Unix epoch),
-- {{uuid}} (a random version-4 UUID as text).
--
-- Timestamps are integer milliseconds since the Unix epoch (UTC): index-friendly, compared
-- as numbers, and the same unit everywhere. Ids are UUIDs as lowercase hyphenated text.
-- The seed's literal insert keeps working unchanged:
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES (...)
CREATE TABLE {{table}} (
    -- Total order of inserts (the rowid); AUTOINCREMENT so a deleted seq is never reused.
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT    NOT NULL UNIQUE DEFAULT ({{uuid}}),
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    event_type     TEXT    NOT NULL,
    payload        TEXT    NOT NULL CHECK (json_valid(payload)),
    headers        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    attempts       INTEGER NOT NULL DEFAULT 0,
    attempts_unavailable INTEGER NOT NULL DEFAULT 0,
    available_at   INTEGER NOT NULL DEFAULT ({{now_ms}}),
    locked_until   INTEGER,
    locked_by      TEXT,
    lock_token     TEXT,
    last_error     TEXT,
    created_at     INTEGER NOT NULL DEFAULT ({{now_ms}}),
    processed_at   INTEGER,
    dead_at        INTEGER
);

-- Only pending rows are indexed: the index stays small however many events were published.
CREATE INDEX {{name:pending}} ON {{table}} (seq)
    WHERE processed_at IS NULL AND dead_at IS NULL;

CREATE INDEX {{name:dead}} ON {{table}} (dead_at)
    WHERE dead_at IS NOT NULL AND processed_at IS NULL;

CREATE VIEW {{name:dead_letters}} AS
    SELECT * FROM {{table}}
    WHERE dead_at IS NOT NULL AND processed_at IS NULL
    ORDER BY seq;

-- Consumer-side deduplication (the inbox), shared by all outboxes of the file.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     TEXT    PRIMARY KEY,
    processed_at INTEGER NOT NULL DEFAULT ({{now_ms}})
);
