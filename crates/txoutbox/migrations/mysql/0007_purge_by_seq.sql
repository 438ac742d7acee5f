-- txoutbox schema, version 7: on PostgreSQL, the retention purge walks the published rows' seq
-- index and the index on `processed_at` goes. Nothing changes on this database (its purge keeps
-- walking that index); the version is here so that every database counts its schema the same
-- way.
SELECT 1 FROM {{table}} WHERE 1 = 0;
