-- Read back the claimed events (`{{list}}`: their seqs) leased under token ?.
SELECT {{columns}} FROM {{table}} WHERE seq IN ({{list}}) AND lock_token = ? ORDER BY seq
