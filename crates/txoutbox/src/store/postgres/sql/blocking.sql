-- The predicate of the `blocking` index (migration 2), repeated so the planner uses it: rows
-- that may hold their aggregate back.
b.processed_at IS NULL AND (b.locked_until IS NOT NULL OR b.attempts > 0 OR b.dead_at IS NOT NULL)
