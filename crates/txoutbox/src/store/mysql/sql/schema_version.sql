SELECT CAST(max(version) AS SIGNED) FROM {{migrations}} WHERE table_name = ?
