-- One event by id, in whatever state.
SELECT {{columns}} FROM {{table}} WHERE id = ?
