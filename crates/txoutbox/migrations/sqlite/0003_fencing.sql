-- txoutbox schema for SQLite, version 3: one process per relay id.

-- The process (a random id per relay instance) that holds the relay id: a second live
-- process with the same --relay-id is refused, and only the holder's exit deregisters it.
ALTER TABLE {{name:relays}} ADD COLUMN instance TEXT;
