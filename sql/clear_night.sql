-- A load of a night ($run: its run, path-safe) makes room for its rows (sql/schema.sql):
-- a night no run has published yet reads this run at once; a published night keeps its
-- current run until this one publishes (sql/publish_audit.sql). Rows of every other run of
-- the night go (earlier loads, failed ones, this run's own from an earlier try), so nothing
-- is appended twice. (Their per-call files go once this commits: call_tables.py.)
DELETE FROM night_calls WHERE ds = CAST($ds AS DATE) AND ds NOT IN (SELECT ds FROM runs);
INSERT INTO night_calls
SELECT CAST($ds AS DATE), $run WHERE CAST($ds AS DATE) NOT IN (SELECT ds FROM night_calls);
DELETE FROM rollout_runs
WHERE ds = CAST($ds AS DATE) AND (run = $run OR run NOT IN (SELECT run FROM night_calls WHERE ds = CAST($ds AS DATE)));
DELETE FROM shard_plan_runs
WHERE ds = CAST($ds AS DATE) AND (run = $run OR run NOT IN (SELECT run FROM night_calls WHERE ds = CAST($ds AS DATE)));
