-- A settle's published rows by their seqs (`{{seqs}}`: the statement's parameter; `seq` is an
-- identity, unique by construction), found through the pending index. The rows then change in
-- seq order, and the index of published rows by seq (`published_seq`) takes their entries in
-- order, at its right end: by id they came in id order, each entry at a place of its own, and
-- that was a quarter of a settle. No `id = ANY(...)` beside it: with the array a parameter,
-- each row would be compared with every id. The relay settles this way (it knows the seqs of
-- what it claimed); published_by_id.sql serves a caller that passes ids alone.
seq = ANY({{seqs}}) AND processed_at IS NULL AND dead_at IS NULL
