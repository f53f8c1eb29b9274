-- Keep the published night's audit rows in the warehouse (replacing a previous run's); the
-- night's load is published (staged_audit: the run's audit files, registered by publish/protocol.py), so it no longer holds the night (sql/retention.sql).
DELETE FROM loads WHERE ds = $ds;
DELETE FROM audit WHERE ds = $ds;
INSERT INTO audit BY NAME
SELECT * REPLACE (CAST(ds AS DATE) AS ds) FROM staged_audit;
