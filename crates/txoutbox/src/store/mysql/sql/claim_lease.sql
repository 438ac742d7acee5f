-- Lease the claimed events (`{{list}}`: their seqs) for ? ms to relay ? under token ?.
UPDATE {{table}} SET locked_until = {{now_ms}} + ?, locked_by = ?, lock_token = ?
WHERE seq IN ({{list}})
