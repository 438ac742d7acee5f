-- Give leased events (?1, ?2: fenced_ids.sql) back unattempted.
UPDATE {{table}} SET {{lease_cleared}} WHERE {{fenced_ids}}
