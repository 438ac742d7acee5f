-- Give back the events relay ?1 still leases.
UPDATE {{table}} SET {{lease_cleared}} WHERE {{unfinished}} AND locked_by = ?1
