-- The keys of the night's token rows (the load parts' `p_token_keys`, load/merge.py: each
-- part read them from its token files' key columns once, load/token_keys.py).
INSERT INTO token_rows
SELECT CAST($ds AS DATE), t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM p_token_keys;
