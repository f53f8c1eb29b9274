-- The night's latest load not yet published: the run that loaded it and the rollouts it read.
SELECT (SELECT run_id FROM loads WHERE ds = $ds) AS run_id, (SELECT n_rollouts FROM loads WHERE ds = $ds) AS n_loaded;
