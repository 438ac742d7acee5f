SELECT EXISTS (SELECT 1 FROM {{table}} WHERE {{unfinished}})
