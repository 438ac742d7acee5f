-- A settle's published rows by their ids ($1), for a settle whose claim does not carry them.
id = ANY($1)
