-- What a night's load used: ledger rows that belong to a rollout of the night, and the
-- token rows in the night's Parquet files (every one is used or a reject row).
SELECT
    (SELECT count(*) FROM ledger l SEMI JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
     WHERE l.ds = $ds)                                   AS ledger_used,
    (SELECT count(*) FROM ({tokens}) t)                  AS token_rows;
