-- Relays dead for more than an hour leave the list.
DELETE FROM {{relays}} WHERE alive_until < now() - interval '1 hour'
