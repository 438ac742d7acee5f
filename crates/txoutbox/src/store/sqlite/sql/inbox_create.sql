CREATE TABLE IF NOT EXISTS processed_events (event_id TEXT PRIMARY KEY,
   processed_at INTEGER NOT NULL DEFAULT ({{now_ms}}))
