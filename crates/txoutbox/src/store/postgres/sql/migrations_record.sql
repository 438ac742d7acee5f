INSERT INTO {{schema}}.txoutbox_migrations (table_name, version, name) VALUES ($1, $2, $3)
