-- The token source of a night without token files: the columns of load/token_keys.py KEYS, no rows.
SELECT NULL::VARCHAR AS t_staging_key, NULL::VARCHAR AS t_rollout_id,
       NULL::VARCHAR AS t_model_call_id, NULL::VARCHAR AS t_file, NULL::BIGINT AS t_row
WHERE false
