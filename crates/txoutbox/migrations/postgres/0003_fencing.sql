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

-- The unfinished events of one partition, for what an ordered relay asks about only its own
-- partitions: when its next event is due (the wait) and whether a claim can find anything at
-- all (an idle relay's claim, beside another relay's backlog, is then one probe per partition
-- instead of a walk of the whole pending index). `partition_key & 63` is the partition
-- (`partition_key % 64` for the non-negative keys of the 64 partitions), written with `&` on
-- purpose: the claim's own `partition_key % n` never matches this index, so its plan (the
-- pending index in seq order) stays as it is.
CREATE INDEX {{index:partition_pending}} ON {{table}} ((partition_key & 63), seq)
    WHERE processed_at IS NULL AND dead_at IS NULL;

-- What each waiting relay waits for: an ordered relay, events of the partitions it owns (at
-- the moment of the commit: partitions it takes while asleep count too); an unordered one,
-- everything. A commit notifies only if some relay waits for one of its events, so an idle
-- relay beside another relay's busy partitions is not woken by every commit (and the writers
-- do not pay for NOTIFY's global lock on every commit).
ALTER TABLE {{name:waiters}} ADD COLUMN ordered boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION {{name:wake}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    wanted boolean;
    waiting boolean;
BEGIN
    IF current_setting('txoutbox.woke', true) = '{{channel}}' THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(bool_or(NOT w.ordered OR EXISTS (
               SELECT 1 FROM {{name:partitions}} p
               WHERE p.partition = NEW.partition_key % 64 AND p.owner = w.relay_id)), false),
           count(*) > 0
      INTO wanted, waiting
      FROM {{name:waiters}} w WHERE w.waiting_until > now();
    IF wanted THEN
        PERFORM pg_notify('{{channel}}', '');
    END IF;
    -- Once notified, or with nobody waiting at all, the transaction's other rows need no look.
    IF wanted OR NOT waiting THEN
        PERFORM set_config('txoutbox.woke', '{{channel}}', true);
    END IF;
    RETURN NULL;
END
$fn$;
