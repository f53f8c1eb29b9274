-- The night's latest load (one row per night): the run that loaded it ($run_id; $run: its
-- rows in rollout_runs and its per-call folder) and the rollouts it read.
DELETE FROM loads WHERE ds = $ds;
INSERT INTO loads (ds, run_id, n_rollouts, loaded_at, run)
VALUES (CAST($ds AS DATE), $run_id, $n_rollouts, now()::TIMESTAMP, $run);
