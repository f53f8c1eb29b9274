-- The merge's global step's own table of the night's rollouts (merge/rollouts.py): a
-- temporary table in place of the warehouse's view of the current runs, with the columns
-- of rollout_runs but its run (the warehouse adds it as the night commits: insert_night.sql).
CREATE TEMP TABLE rollouts AS SELECT * EXCLUDE (run) FROM main.rollout_runs LIMIT 0;
