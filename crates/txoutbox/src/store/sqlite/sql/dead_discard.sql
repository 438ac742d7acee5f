-- Delete the dead letters matching `{{condition}}` (`EventFilter::to_sql`) for good.
DELETE FROM {{table}} WHERE {{condition}}
