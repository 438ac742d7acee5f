-- At most ? published events older than ? ms: one statement, its locks bounded by the batch.
DELETE FROM {{table}} WHERE processed_at IS NOT NULL AND processed_at < {{now_ms}} - ?
ORDER BY processed_at LIMIT ?
