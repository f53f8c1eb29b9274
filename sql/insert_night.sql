-- The merged night's rollout rows and shard ranges (`night_rollouts`, `night_groups`:
-- registered by merge/commit.py) as the rows of its run $run (path-safe).
INSERT INTO rollout_runs BY NAME
SELECT CAST($ds AS DATE) AS ds, $run AS run, * FROM night_rollouts;
INSERT INTO shard_plan_runs BY NAME
SELECT CAST($ds AS DATE) AS ds, group_id, shard, $run AS run FROM night_groups;
