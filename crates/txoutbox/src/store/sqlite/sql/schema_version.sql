SELECT max(version) FROM txoutbox_migrations WHERE table_name = ?1
