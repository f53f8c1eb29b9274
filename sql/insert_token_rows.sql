-- The keys of token rows (load/token_keys.py registers them as `token_keys`: staging_key,
-- rollout_id, model_call_id, file, row number), read from the files' key columns once.
INSERT INTO token_rows
SELECT CAST($ds AS DATE), t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM token_keys;
