-- Published rows (`{{list}}`: a mark per id), fenced by the claim token, deleted (retention
-- `delete`).
DELETE FROM {{table}} WHERE id IN ({{list}}) AND lock_token = ?
