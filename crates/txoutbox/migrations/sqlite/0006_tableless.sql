-- txoutbox schema, version 6: tableless events (transactional logical messages), which are
-- PostgreSQL's alone (its WAL source). Nothing changes on this database; the version is here so
-- that every database counts its schema the same way.
SELECT 1 FROM {{table}} WHERE 1 = 0;
