-- Several events from one JSON array of rows (?1), in array order, so `seq` follows it.
INSERT INTO {{table}} ({{insert_columns}})
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
FROM json_each(?1) ORDER BY key
