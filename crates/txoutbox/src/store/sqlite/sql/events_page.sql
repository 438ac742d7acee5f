-- One page of events: `{{condition}}` is the filter's (built per call from fixed column names
-- and `?` marks by `EventFilter::page_sql`), the last mark the page's limit.
SELECT {{columns}} FROM {{table}} WHERE {{condition}} ORDER BY seq LIMIT ?
