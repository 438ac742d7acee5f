-- Relays dead for more than an hour leave the list.
DELETE FROM {{relays}} WHERE alive_until < {{now_ms}} - 3600000
