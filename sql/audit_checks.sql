-- Numbers the staged night must satisfy before it is published (CONTRACT.md 3.4):
-- rollouts in = audit rows (each rollout once); ok rollouts = distinct rollouts in rows.
SELECT
    (SELECT count(*) FROM rollouts WHERE ds = $ds)                            AS rollouts_in,
    (SELECT count(*) FROM read_parquet($audit_files, hive_partitioning = false))                         AS audit_rows,
    (SELECT count(DISTINCT rollout_id) FROM read_parquet($audit_files, hive_partitioning = false))       AS audit_rollouts,
    (SELECT count(*) FROM read_parquet($audit_files, hive_partitioning = false) WHERE status = 'ok')     AS ok_rollouts,
    (SELECT count(*) FROM read_parquet($rows_files, hive_partitioning = false))                          AS n_rows,
    (SELECT count(DISTINCT rollout_id) FROM read_parquet($rows_files, hive_partitioning = false))        AS rollouts_in_rows;
