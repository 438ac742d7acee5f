-- Give back the events of the claim (`{{list}}`: their seqs) that a dead letter holds back,
-- fenced by the claim token.
UPDATE {{table}} SET {{lease_cleared}} WHERE seq IN ({{list}}) AND lock_token = ?
