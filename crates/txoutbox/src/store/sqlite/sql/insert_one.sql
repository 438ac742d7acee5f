INSERT INTO {{table}} ({{insert_columns}}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
