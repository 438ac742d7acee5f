-- Several events from one JSON array of rows, in array order, so `seq` follows it.
INSERT INTO {{table}} ({{insert_columns}})
SELECT j.id, j.aggregate_type, j.aggregate_id, j.event_type, j.payload, j.headers
FROM JSON_TABLE(?, '$[*]' COLUMNS (
    n FOR ORDINALITY,
    id CHAR(36) PATH '$[0]',
    aggregate_type VARCHAR(255) PATH '$[1]',
    aggregate_id VARCHAR(255) PATH '$[2]',
    event_type VARCHAR(255) PATH '$[3]',
    payload LONGTEXT PATH '$[4]',
    headers LONGTEXT PATH '$[5]'
)) AS j
ORDER BY j.n
