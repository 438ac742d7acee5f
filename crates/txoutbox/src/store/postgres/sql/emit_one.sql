-- One tableless event (a transactional logical message, no row), through the function that
-- migration 6 installs, so that the library and plain SQL write the same content.
SELECT {{emit_event}}($1, $2, $3, $4, $5, $6, $7, $8)
