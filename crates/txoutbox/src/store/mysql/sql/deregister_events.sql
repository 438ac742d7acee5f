-- Give back the events relay ? still leases.
UPDATE {{table}} SET {{lease_cleared}} WHERE locked_by = ? AND {{unfinished}}
