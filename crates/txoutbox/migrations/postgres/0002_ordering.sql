-- txoutbox schema, version 2: per-aggregate ordering across relays.

-- A stable 31-bit hash of the aggregate (md5: the same on every PostgreSQL version), stored
-- at insert. The partition of an event is partition_key % <number of partitions>.
ALTER TABLE {{table}}
    ADD COLUMN partition_key integer GENERATED ALWAYS AS (
        (('x' || left(md5(aggregate_type || '/' || aggregate_id), 8))::bit(32)::integer) & 2147483647
    ) STORED;

-- "Does an earlier event of this aggregate hold it back?": the ordered claim asks this of
-- every candidate. Only rows that can hold an aggregate back are indexed: leased ones, ones
-- that failed before (backing off), dead letters (in `hold` mode). A backlog of fresh events
-- is not in it, so the question costs one short index probe.
CREATE INDEX {{index:blocking}} ON {{table}} (partition_key, seq)
    WHERE processed_at IS NULL AND (locked_until IS NOT NULL OR attempts > 0 OR dead_at IS NOT NULL);

-- Retention deletes published rows by age.
CREATE INDEX {{index:processed}} ON {{table}} (processed_at)
    WHERE processed_at IS NOT NULL;

-- The partitions of the aggregate-hash space. Each is owned by at most one relay at a time,
-- under a lease; relays share them out among themselves through this table.
CREATE TABLE {{name:partitions}} (
    partition   integer     PRIMARY KEY,
    owner       text,
    lease_until timestamptz
);
INSERT INTO {{name:partitions}} (partition) SELECT generate_series(0, 63);

-- Live relays: their heartbeat, mode, and (for `txoutbox status`) where they run.
CREATE TABLE {{name:relays}} (
    relay_id     text        PRIMARY KEY,
    mode         text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Considered alive until then (its heartbeat plus its partition lease).
    alive_until  timestamptz NOT NULL
);
