-- Give leased events (`{{list}}`: a mark per id) back unattempted, fenced by the claim token.
UPDATE {{table}} SET {{lease_cleared}} WHERE id IN ({{list}}) AND lock_token = ?
