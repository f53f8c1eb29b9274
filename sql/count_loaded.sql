-- What a night's load used: ledger lines that belong to a rollout of the night, the token
-- rows in the night's token files (every one is used or a reject row), and the ledger lines
-- of failed attempts (`failed_attempts`: named by NeMo Gym's failures files, CONTRACT.md
-- 2.1). Calls and token rows the load derived from Gym's own capture are counted apart.
SELECT
    (SELECT count(*) FROM ledger l SEMI JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
     WHERE l.ds = $ds AND l.capture IS NULL)                                     AS ledger_used,
    (SELECT count(*) FROM ({tokens}) t WHERE starts_with(t.t_file, $token_dir)) AS token_rows,
    (SELECT count(*) FROM ledger l ANTI JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
     WHERE l.ds = $ds AND l.capture IS NULL
       AND l.rollout_id IN (SELECT rollout_id FROM failed_attempts))            AS ledger_failed;
