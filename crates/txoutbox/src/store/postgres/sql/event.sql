-- One event by id ($1), in whatever state.
SELECT {{columns}} FROM {{table}} WHERE id = $1
