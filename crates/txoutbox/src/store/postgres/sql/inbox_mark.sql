INSERT INTO {{processed_events}} (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING
