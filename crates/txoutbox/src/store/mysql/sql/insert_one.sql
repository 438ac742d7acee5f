INSERT INTO {{table}} ({{insert_columns}}) VALUES (?, ?, ?, ?, ?, ?)
