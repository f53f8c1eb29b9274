-- Token rows of the night's token files that no ledger row asks for: counted as rejects,
-- never used (the rows the load derives itself live elsewhere, and are all asked for).
INSERT INTO rejects BY NAME
SELECT CAST($ds AS DATE) AS ds, 'tokens' AS source, replace(t.t_file, $token_dir, '') AS file, t.t_row AS line,
       'token row matches no ledger staging_key' AS error, t.t_staging_key AS raw,
       t.t_rollout_id AS rollout_id, t.t_model_call_id AS model_call_id
FROM ({tokens}) t
ANTI JOIN (SELECT staging_key FROM ledger WHERE ds = $ds) l ON l.staging_key = t.t_staging_key
WHERE starts_with(t.t_file, $token_dir);
