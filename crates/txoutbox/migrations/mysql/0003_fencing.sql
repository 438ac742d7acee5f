-- txoutbox schema for MySQL / MariaDB, version 3: one process per relay id, and a
-- deregister that locks only its own rows.

-- The process (a random id per relay instance) that holds a relay id: a second live process
-- with the same --relay-id is refused, and only the holder's exit deregisters it.
ALTER TABLE {{name:relays}} ADD COLUMN instance VARCHAR(64) NULL
;;
-- Deregister releases `WHERE locked_by = ?`: without an index it scanned (and, under
-- REPEATABLE READ, next-key locked) every pending row, so another relay's SKIP LOCKED claim
-- could skip an earlier event of an aggregate and take a later one.
CREATE INDEX {{index:locked_by}} ON {{table}} (locked_by)
