CREATE TABLE IF NOT EXISTS {{processed_events}} (event_id CHAR(36) CHARACTER SET ascii NOT NULL PRIMARY KEY,
   processed_at BIGINT NOT NULL DEFAULT ({{now_ms}})) ENGINE = InnoDB
