-- The token source of a night without token files: the columns of token_files.sql, no rows.
SELECT NULL::VARCHAR AS t_staging_key, NULL::VARCHAR AS t_rollout_id,
       NULL::VARCHAR AS t_model_call_id, NULL::VARCHAR AS t_parent_call_id,
       NULL::VARCHAR AS t_mode, NULL::BIGINT AS t_prev_len, NULL::BIGINT AS t_delta_len,
       NULL::BIGINT AS t_cum_len, NULL::BIGINT AS t_weight_version,
       NULL::BIGINT AS t_schema_version, NULL::BIGINT AS t_digest_version,
       NULL::BIGINT AS t_extras_digest_version, NULL::VARCHAR AS t_digest,
       NULL::VARCHAR AS t_extras_digest, NULL::VARCHAR AS t_chain_hash,
       NULL::VARCHAR AS t_cumulative_hash, NULL::BIGINT[] AS t_token_ids,
       NULL::FLOAT[] AS t_mask, NULL::FLOAT[] AS t_logprobs, NULL::VARCHAR AS t_file,
       NULL::BIGINT AS t_row
WHERE false
