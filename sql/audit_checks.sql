-- Numbers the staged night must satisfy before it is published (CONTRACT.md 3.4):
-- rollouts in = audit rows (each rollout once); ok rollouts = distinct rollouts in rows.
-- Rollouts in: those of the night's latest load (its run's rows, current or not yet).
-- staged_audit / staged_rows: the run's files, registered by publish/protocol.py.
SELECT
    (SELECT count(*) FROM rollout_runs r
     SEMI JOIN loads l ON l.ds = r.ds AND l.run = r.run WHERE r.ds = $ds) AS rollouts_in,
    (SELECT count(*) FROM staged_audit)                         AS audit_rows,
    (SELECT count(DISTINCT rollout_id) FROM staged_audit)       AS audit_rollouts,
    (SELECT count(*) FROM staged_audit WHERE status = 'ok')     AS ok_rollouts,
    (SELECT count(*) FROM staged_rows)                          AS n_rows,
    (SELECT count(DISTINCT rollout_id) FROM staged_rows)        AS rollouts_in_rows;
