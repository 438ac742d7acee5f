-- Several events from one JSON array of rows (?1), in array order, so `seq` follows it. Bytes
-- come as hex (a JSON null for a JSON event).
INSERT INTO {{table}} ({{insert_columns_bytes}})
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
       unhex(json_extract(value, '$[6]')), json_extract(value, '$[7]')
FROM json_each(?1) ORDER BY key
