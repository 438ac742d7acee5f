-- txoutbox schema for MySQL / MariaDB, version 2: partitions shared by relays.

-- The partitions of the aggregate-hash space. Each is owned by at most one relay at a time,
-- under a lease; relays share them out among themselves through this table.
CREATE TABLE {{name:partitions}} (
    `partition`  INT          NOT NULL PRIMARY KEY,
    owner        VARCHAR(255) NULL,
    lease_until  BIGINT       NULL
) ENGINE = InnoDB
;;
-- 64 partitions: (0), (1), ... (63).
INSERT INTO {{name:partitions}} (`partition`) VALUES {{partition_rows}}
;;
-- Live relays: their heartbeat and mode.
CREATE TABLE {{name:relays}} (
    relay_id     VARCHAR(255) NOT NULL PRIMARY KEY,
    mode         VARCHAR(32)  NOT NULL,
    started_at   BIGINT       NOT NULL DEFAULT ({{now_ms}}),
    heartbeat_at BIGINT       NOT NULL DEFAULT ({{now_ms}}),
    alive_until  BIGINT       NOT NULL
) ENGINE = InnoDB
