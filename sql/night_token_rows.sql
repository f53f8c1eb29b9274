-- The token rows of one night as sql/insert_token_rows.sql kept them, shaped like
-- load/token_keys.py (the token rows of the queries that join calls to them).
SELECT t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM token_rows WHERE ds = CAST($ds AS DATE)
