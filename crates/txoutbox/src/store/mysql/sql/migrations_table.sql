CREATE TABLE IF NOT EXISTS {{migrations}} (
    table_name VARCHAR(64) NOT NULL,
    version    INT         NOT NULL,
    name       VARCHAR(64) NOT NULL,
    applied_at BIGINT      NOT NULL,
    PRIMARY KEY (table_name, version)
) ENGINE = InnoDB
