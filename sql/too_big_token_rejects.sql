-- The token rows of row groups too big to decode (read.token_files): reject rows that say
-- why, read from the key columns only. `too_big_keys` is registered by the load: the keys
-- of those row groups (load/token_keys.py) and the reason of each.
INSERT INTO rejects BY NAME
SELECT CAST($ds AS DATE) AS ds, 'tokens' AS source, replace(t.t_file, $token_dir, '') AS file, t.t_row AS line,
       t.why AS error, t.t_staging_key AS raw, t.t_rollout_id AS rollout_id, t.t_model_call_id AS model_call_id
FROM too_big_keys t;
