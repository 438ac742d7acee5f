-- Published rows (?1, ?2: fenced_ids.sql), deleted (retention `delete`).
DELETE FROM {{table}} WHERE {{fenced_ids}}
