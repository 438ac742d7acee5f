INSERT INTO {{table}} ({{insert_columns_bytes}}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
