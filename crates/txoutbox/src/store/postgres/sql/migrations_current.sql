SELECT coalesce(max(version), 0) FROM {{schema}}.txoutbox_migrations WHERE table_name = $1
