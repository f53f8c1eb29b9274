-- The night's latest load (one row per night): the run and the rollouts it read.
DELETE FROM loads WHERE ds = $ds;
INSERT INTO loads VALUES (CAST($ds AS DATE), $run_id, $n_rollouts, now()::TIMESTAMP);
