-- One bucket of staging keys (merge/keys.py): each token row with the rollouts whose calls
-- ask for it (`p_ledger_keys`: staging_key, rollout_id, capture, part), once per asking
-- rollout: a ledger line (capture null) finds the night's token rows (`p_token_keys`), a
-- derived call the token rows its own part derived (`p_derived_keys`, part kept). The
-- bucket of that rollout then joins them to its calls (merge/bucket.py), as the shards
-- joined calls to the night's token rows by staging key alone.
SELECT DISTINCT l.rollout_id, t.t_staging_key, t.t_rollout_id, t.t_model_call_id, t.t_file, t.t_row,
       CAST(NULL AS BIGINT) AS part
FROM p_ledger_keys l
JOIN p_token_keys t ON t.t_staging_key = l.staging_key
WHERE l.capture IS NULL
UNION ALL
SELECT DISTINCT l.rollout_id, t.t_staging_key, t.t_rollout_id, t.t_model_call_id, t.t_file, t.t_row, t.part
FROM p_ledger_keys l
JOIN p_derived_keys t ON t.t_staging_key = l.staging_key AND t.part = l.part
WHERE l.capture IS NOT NULL
