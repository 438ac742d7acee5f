-- "Not yet published and not dead".
processed_at IS NULL AND dead_at IS NULL
