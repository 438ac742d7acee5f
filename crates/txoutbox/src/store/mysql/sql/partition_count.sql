SELECT count(*) FROM {{partitions}}
