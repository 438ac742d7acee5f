-- `INSERT IGNORE` on the primary key: a concurrent consumer of the same id waits on the first
-- one's row lock, then sees the row.
INSERT IGNORE INTO {{processed_events}} (event_id) VALUES (?)
