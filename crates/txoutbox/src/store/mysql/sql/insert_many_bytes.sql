-- Several events from one JSON array of rows, in array order, so `seq` follows it. Bytes come
-- as hex (a JSON null for a JSON event, which JSON_TABLE reads as NULL).
INSERT INTO {{table}} ({{insert_columns_bytes}})
SELECT j.id, j.aggregate_type, j.aggregate_id, j.event_type, j.payload, j.headers,
       UNHEX(j.payload_hex), j.content_type
FROM JSON_TABLE(?, '$[*]' COLUMNS (
    n FOR ORDINALITY,
    id CHAR(36) PATH '$[0]',
    aggregate_type VARCHAR(255) PATH '$[1]',
    aggregate_id VARCHAR(255) PATH '$[2]',
    event_type VARCHAR(255) PATH '$[3]',
    payload LONGTEXT PATH '$[4]',
    headers LONGTEXT PATH '$[5]',
    payload_hex LONGTEXT PATH '$[6]',
    content_type VARCHAR(255) PATH '$[7]'
)) AS j
ORDER BY j.n
