-- Make pending events (`{{list}}`: a mark per id) due now: their backoff waited out a publisher
-- outage that has ended. Leased, published and dead events stay as they are.
UPDATE {{table}} SET available_at = {{now_ms}}
WHERE id IN ({{list}}) AND {{unfinished}} AND available_at > {{now_ms}}
  AND (locked_until IS NULL OR locked_until <= {{now_ms}})
