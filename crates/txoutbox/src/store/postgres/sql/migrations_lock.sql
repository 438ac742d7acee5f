-- One migrator at a time, across processes.
SELECT pg_advisory_xact_lock(7365838120958127469)
