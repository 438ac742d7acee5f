-- A settle's failures, unnested: $2 ids, $3 errors, $4 delays (ms), $6 dead, $7 unavailable.
unnest($2::uuid[], $3::text[], $4::bigint[], $6::bool[], $7::bool[]) AS f(id, err, delay_ms, dead, unavailable)
