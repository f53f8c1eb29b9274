-- A reader snapshot of one small warehouse table (runs, rejects); publish/protocol.py writes
-- it to <output>/tables/<table>.parquet in one step.
SELECT * FROM {table} ORDER BY ALL
