-- txoutbox schema, version 4: the WAL source (`txoutbox relay --source wal`), which is
-- PostgreSQL's alone (its logical replication stream). Nothing changes on this database; the
-- version is here so that every database counts its schema the same way.
SELECT 1 FROM {{table}} WHERE 1 = 0;
