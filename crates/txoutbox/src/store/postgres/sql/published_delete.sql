-- Published rows of a row-lease claim (`published_rows`, as in published_mark.sql), deleted
-- (retention `delete`), fenced by the claim token ($5).
DELETE FROM {{table}} WHERE {{published_rows}} AND lock_token = $5 RETURNING 1
