SELECT max(version) FROM {{schema}}.txoutbox_migrations WHERE table_name = $1
