-- Ordered: only while relay ?3 holds the file's relay lease, with a margin.
AND EXISTS (SELECT 1 FROM {{relays}} WHERE relay_id = ?3
   AND alive_until > {{now_ms}} + {{claim_margin_ms}})
