-- One bucket of staging keys (merge/keys.py): token rows of the night's token files that no
-- ledger line asks for, as reject rows: counted, never used (the rows the load derives live
-- elsewhere, and are all asked for).
SELECT 'tokens' AS source, replace(t.t_file, $token_dir, '') AS file, t.t_row AS line,
       'token row matches no ledger staging_key' AS error, t.t_staging_key AS raw,
       t.t_rollout_id AS rollout_id, t.t_model_call_id AS model_call_id
FROM p_token_keys t
ANTI JOIN (SELECT staging_key FROM p_ledger_keys WHERE capture IS NULL) l ON l.staging_key = t.t_staging_key
WHERE starts_with(t.t_file, $token_dir)
ORDER BY file, line
