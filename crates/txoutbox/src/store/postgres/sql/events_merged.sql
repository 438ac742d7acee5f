-- A page of events of any state: the merge of the three disjoint states (events_branch.sql
-- each), so no page sorts the whole table. Per call, as in events_branch.sql.
SELECT * FROM (({{unfinished_page}}) UNION ALL ({{dead_page}}) UNION ALL ({{published_page}})) page
ORDER BY seq LIMIT {{limit}}
