SELECT CAST(coalesce(max(version), 0) AS SIGNED) FROM {{migrations}} WHERE table_name = ?
