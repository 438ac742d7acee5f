-- txoutbox schema, version 7: the retention purge walks the published rows' seq index
-- (`published_seq`, version 3) instead of an index of its own.
--
-- Every settle is an UPDATE that writes a new version of the row, and the new version takes an
-- entry in each index whose condition it meets: the primary key, `published_seq` and, until
-- now, `processed` (version 2). That third entry was a fifth of a settle's time, and a settle is
-- most of what the table relay asks of the database, for an index only the purge read, once a
-- minute. The purge now pages through published rows in seq order and stops at the first one
-- created after its cutoff (sql/purge.sql), so it reads what it deletes, and little more.
DROP INDEX {{name:processed}};
