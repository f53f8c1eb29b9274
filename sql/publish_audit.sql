-- Keep the published night's audit rows in the warehouse (replacing a previous run's); the
-- night's load is published, so it no longer holds the night (sql/retention.sql).
DELETE FROM loads WHERE ds = $ds;
DELETE FROM audit WHERE ds = $ds;
INSERT INTO audit BY NAME
SELECT * REPLACE (CAST(ds AS DATE) AS ds) FROM read_parquet($audit_files, hive_partitioning = false);
