-- Version 9 -> 10: a night's rollouts and shard plan are kept per run (rollout_runs,
-- shard_plan_runs) and read through views of the night's current run, named as the tables
-- were (sql/schema.sql), so that a rebuild replaces a published night only when it
-- publishes. The rows a warehouse holds belong to the run night_calls names (a load of
-- version 9 named its run at once); a night with no per-call files gets the run "migrated".
INSERT INTO night_calls
SELECT DISTINCT ds, 'migrated' FROM rollouts WHERE ds NOT IN (SELECT ds FROM night_calls)
UNION
SELECT DISTINCT ds, 'migrated' FROM shard_plan WHERE ds NOT IN (SELECT ds FROM night_calls);
ALTER TABLE rollouts RENAME TO rollout_runs;
ALTER TABLE rollout_runs ADD COLUMN run VARCHAR;
UPDATE rollout_runs SET run = c.run FROM night_calls c WHERE c.ds = rollout_runs.ds;
ALTER TABLE shard_plan RENAME TO shard_plan_runs;
ALTER TABLE shard_plan_runs ADD COLUMN run VARCHAR;
UPDATE shard_plan_runs SET run = c.run FROM night_calls c WHERE c.ds = shard_plan_runs.ds;
ALTER TABLE loads ADD COLUMN run VARCHAR;
UPDATE loads SET run = c.run FROM night_calls c WHERE c.ds = loads.ds;
