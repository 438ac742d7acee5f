INSERT INTO {{migrations}} (table_name, version, name, applied_at) VALUES (?, ?, ?, {{now_ms}})
