-- At most ?2 published events older than ?1 ms. SQLite has no `DELETE ... LIMIT` by default:
-- the rows of one batch are picked by a sub-select.
DELETE FROM {{table}} WHERE seq IN (SELECT seq FROM {{table}}
   WHERE processed_at IS NOT NULL AND processed_at < {{now_ms}} - ?1
   ORDER BY processed_at LIMIT ?2)
