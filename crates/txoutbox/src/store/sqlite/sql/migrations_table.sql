CREATE TABLE IF NOT EXISTS txoutbox_migrations (
    table_name TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (table_name, version)
)
