-- One state's rows of a page of events, in its own `seq` order. Per call: `{{state}}` (a fixed
-- condition per state), `{{condition}}` (the filter's: fixed column names and `$n` marks,
-- `EventFilter::page_sql`) and `{{limit}}` (the mark of the page's limit).
SELECT {{columns}} FROM {{table}} WHERE {{state}} AND {{condition}} ORDER BY seq LIMIT {{limit}}
