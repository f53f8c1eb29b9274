-- Publish a run of the night ($run_id; $run: path-safe) in the warehouse, idempotently (a
-- recovery replays it): the run becomes the night's current one (its rollouts, shard plan and
-- per-call files) when it is the night's latest load, every other run's rows go (their files
-- once this commits: call_tables.remove_other_runs), and its audit rows replace the night's.
-- The night's load is published, so it no longer holds the night (sql/retention.sql).
-- staged_audit: the run's audit files, registered by publish/protocol.py.
DELETE FROM night_calls
WHERE ds = CAST($ds AS DATE) AND EXISTS (SELECT 1 FROM loads WHERE ds = CAST($ds AS DATE) AND run = $run);
INSERT INTO night_calls SELECT ds, run FROM loads WHERE ds = CAST($ds AS DATE) AND run = $run;
DELETE FROM rollout_runs
WHERE ds = CAST($ds AS DATE) AND run NOT IN (SELECT run FROM night_calls WHERE ds = CAST($ds AS DATE));
DELETE FROM shard_plan_runs
WHERE ds = CAST($ds AS DATE) AND run NOT IN (SELECT run FROM night_calls WHERE ds = CAST($ds AS DATE));
DELETE FROM loads WHERE ds = $ds;
DELETE FROM audit WHERE ds = $ds;
INSERT INTO audit BY NAME
SELECT * REPLACE (CAST(ds AS DATE) AS ds) FROM staged_audit;
