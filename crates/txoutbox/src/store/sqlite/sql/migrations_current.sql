SELECT coalesce(max(version), 0) FROM txoutbox_migrations WHERE table_name = ?1
