-- txoutbox schema for SQLite, version 2: per-aggregate ordering and the one-relay lease.

-- "Does an earlier event of this aggregate hold it back?": asked of every candidate of an
-- ordered claim. Only rows that can hold an aggregate back are indexed.
CREATE INDEX {{name:blocking}} ON {{table}} (aggregate_type, aggregate_id, seq)
    WHERE processed_at IS NULL AND (locked_until IS NOT NULL OR attempts > 0 OR dead_at IS NOT NULL);

-- Retention deletes published rows by age.
CREATE INDEX {{name:processed}} ON {{table}} (processed_at)
    WHERE processed_at IS NOT NULL;

-- The relay of this outbox. One relay per SQLite file: a relay refuses to start while
-- another one's row is alive (its heartbeat renews `alive_until`).
CREATE TABLE {{name:relays}} (
    relay_id     TEXT    PRIMARY KEY,
    mode         TEXT    NOT NULL,
    started_at   INTEGER NOT NULL DEFAULT ({{now_ms}}),
    heartbeat_at INTEGER NOT NULL DEFAULT ({{now_ms}}),
    alive_until  INTEGER NOT NULL
);
