locked_until = NULL, locked_by = NULL, lock_token = NULL
