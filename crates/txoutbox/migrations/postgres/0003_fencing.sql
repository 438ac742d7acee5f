-- txoutbox schema, version 3: settles fenced by ownership epoch, one process per relay id.

-- Every time a partition is taken (by any relay, the same one included) its epoch goes up.
-- An ordered claim carries the epochs of the partitions it came from, and its settle
-- changes nothing unless they are still the same: a settle that comes back after the
-- partition went to another relay and back is fenced off, not only one whose relay lost it.
ALTER TABLE {{name:partitions}} ADD COLUMN epoch bigint NOT NULL DEFAULT 0;

-- The process (a random id per relay instance) that holds a relay id: a second live process
-- with the same --relay-id is refused, and only the holder's exit deregisters it.
ALTER TABLE {{name:relays}} ADD COLUMN instance text;

-- The admin listings page by seq in one state at a time: dead letters (`dlq list`, the
-- dashboard) and published events (`events list --state published`, and the all-states page,
-- which merges the three disjoint states) walk these instead of sorting the whole table.
CREATE INDEX {{index:dead_seq}} ON {{table}} (seq) WHERE dead_at IS NOT NULL AND processed_at IS NULL;
CREATE INDEX {{index:published_seq}} ON {{table}} (seq) WHERE processed_at IS NOT NULL;
