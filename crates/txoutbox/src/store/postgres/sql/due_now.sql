-- The second look of a wait: is anything this relay can take due now?
SELECT coalesce(({{due}}) <= 0, false)
