-- The rows of a JSON array of ids (?1) still leased under the claim token (?2).
id IN (SELECT value FROM json_each(?1)) AND lock_token = ?2
