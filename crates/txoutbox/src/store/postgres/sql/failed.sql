-- What a failed attempt does to its row (`e`), from the failures fragment (`f`).
attempts = e.attempts + 1,
attempts_unavailable = e.attempts_unavailable + f.unavailable::int,
last_error = f.err,
available_at = now() + f.delay_ms * interval '1 millisecond',
dead_at = CASE WHEN f.dead THEN now() END
