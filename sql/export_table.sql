-- A reader snapshot of one small warehouse table (runs, rejects) as Parquet; publish.py
-- writes it to a temporary name and renames it into <output>/tables/.
COPY (SELECT * FROM {table} ORDER BY ALL) TO '{path}' (FORMAT parquet)
