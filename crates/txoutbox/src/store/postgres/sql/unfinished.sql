-- "Not yet published and not dead": the rows the partial index covers.
processed_at IS NULL AND dead_at IS NULL
