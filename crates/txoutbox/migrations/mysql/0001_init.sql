-- txoutbox schema for MySQL 8 / MariaDB 10.6+, version 1: the same columns as on PostgreSQL,
-- with types adapted. Placeholders: {{table}}, {{name:SUFFIX}} (an object named after the
-- table, in the same database), {{index:SUFFIX}} (an index name), {{now_ms}} (the current
-- time as integer milliseconds since the Unix epoch). Statements are separated by a line
-- holding only `;;`.
--
-- Timestamps are integer milliseconds since the Unix epoch: no session time zone can shift
-- them, and they compare as numbers. Ids are UUIDs as hyphenated text. The seed's literal
-- insert keeps working unchanged:
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES (...)
CREATE TABLE {{table}} (
    -- Total order of inserts, and the clustered key: the relay claims by it.
    seq            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id             CHAR(36)     CHARACTER SET ascii NOT NULL DEFAULT (uuid()),
    aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    event_type     VARCHAR(255) NOT NULL,
    payload        LONGTEXT     NOT NULL CHECK (json_valid(payload)),
    headers        LONGTEXT     NOT NULL DEFAULT ('{}') CHECK (json_valid(headers)),
    attempts       INT          NOT NULL DEFAULT 0,
    attempts_unavailable INT    NOT NULL DEFAULT 0,
    available_at   BIGINT       NOT NULL DEFAULT ({{now_ms}}),
    locked_until   BIGINT       NULL,
    locked_by      VARCHAR(255) NULL,
    lock_token     CHAR(36)     CHARACTER SET ascii NULL,
    last_error     TEXT         NULL,
    created_at     BIGINT       NOT NULL DEFAULT ({{now_ms}}),
    processed_at   BIGINT       NULL,
    dead_at        BIGINT       NULL,
    -- A stable 31-bit hash of the aggregate; its partition is partition_key % partitions.
    partition_key  INT          AS (CRC32(CONCAT(aggregate_type, '/', aggregate_id)) & 2147483647) STORED,
    UNIQUE KEY {{index:id}} (id),
    -- Pending rows first, in seq order: the claim reads this index from its start.
    KEY {{index:pending}} (processed_at, dead_at, seq),
    -- "Does an earlier event of this aggregate hold it back?": only its unpublished events
    -- are probed (processed_at IS NULL), however many were published before.
    KEY {{index:aggregate}} (aggregate_type, aggregate_id, processed_at, seq),
    KEY {{index:dead}} (dead_at),
    KEY {{index:processed}} (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4
;;
CREATE VIEW {{name:dead_letters}} AS
    SELECT * FROM {{table}}
    WHERE dead_at IS NOT NULL AND processed_at IS NULL
;;
-- Consumer-side deduplication (the inbox), shared by all outboxes of the database.
CREATE TABLE IF NOT EXISTS {{name_plain:processed_events}} (
    event_id     CHAR(36) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    processed_at BIGINT   NOT NULL DEFAULT ({{now_ms}})
) ENGINE = InnoDB
