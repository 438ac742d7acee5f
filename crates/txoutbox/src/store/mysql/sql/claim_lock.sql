-- Of the picked events (`{{list}}`: their seqs), those still claimable and not being changed
-- by anyone else right now.
SELECT seq FROM {{table}} WHERE seq IN ({{list}}) AND {{unfinished}}
  AND (locked_until IS NULL OR locked_until <= {{now_ms}})
ORDER BY seq FOR UPDATE SKIP LOCKED
