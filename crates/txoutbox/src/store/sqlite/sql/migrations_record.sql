INSERT INTO txoutbox_migrations (table_name, version, name, applied_at)
VALUES (?1, ?2, ?3, {{now_ms}})
