-- One row per published run (idempotent: a publish finished by recovery records it once).
DELETE FROM runs WHERE run_id = $run_id;
INSERT INTO runs BY NAME
SELECT $run_id AS run_id, CAST($ds AS DATE) AS ds, now()::TIMESTAMP AS published_at,
       $input_dir AS input_dir, $mode AS mode, $offchain AS offchain, $options AS options,
       count(*) AS n_rollouts, count(*) FILTER (status = 'ok') AS n_ok,
       count(*) FILTER (status = 'masked') AS n_masked, $n_rows AS n_rows,
       (SELECT count(*) FROM rejects WHERE ds = $ds) AS n_rejects, $seconds AS seconds,
       $inputs AS inputs
FROM audit WHERE ds = $ds;
