-- txoutbox schema, version 4: the WAL source (`txoutbox relay --source wal`).
--
-- The WAL source delivers events from the replication stream and never claims their rows. An
-- event it cannot deliver now (its publish failed, or an earlier event of its aggregate is
-- waiting in the table) it hands to the table path: `handed_off_at` says when. The table path
-- of a WAL relay claims only such rows; the table relay ignores the column.
ALTER TABLE {{table}} ADD COLUMN handed_off_at timestamptz;

-- The table path's claim and the stream's "is this aggregate waiting in the table?" read
-- only handed-off rows that are not published: usually none, a short index in any case.
CREATE INDEX {{index:handed_off}} ON {{table}} (seq)
    WHERE handed_off_at IS NOT NULL AND processed_at IS NULL;
