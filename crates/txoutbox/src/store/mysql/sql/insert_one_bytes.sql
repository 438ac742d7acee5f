INSERT INTO {{table}} ({{insert_columns_bytes}}) VALUES (?, ?, ?, ?, ?, ?, UNHEX(?), ?)
