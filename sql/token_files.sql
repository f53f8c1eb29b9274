-- Token rows of one group of Parquet files sharing one Arrow schema, normalized to the
-- canonical types of CONTRACT.md 2.3. The reader (read.py) fills in the file list and,
-- per accepted alternative type, the expressions of the digest columns (hex text as is,
-- fixed_size_binary(32) -> lower(hex(..))), of the mask, and of the logprobs (float64
-- narrowed to float32, overflow to +-inf rather than an error).
SELECT
    staging_key                              AS t_staging_key,
    rollout_id                               AS t_rollout_id,
    model_call_id                            AS t_model_call_id,
    parent_call_id                           AS t_parent_call_id,
    mode                                     AS t_mode,
    CAST(prev_len AS BIGINT)                 AS t_prev_len,
    CAST(delta_len AS BIGINT)                AS t_delta_len,
    CAST(cum_len AS BIGINT)                  AS t_cum_len,
    CAST(weight_version AS BIGINT)           AS t_weight_version,
    CAST(schema_version AS BIGINT)           AS t_schema_version,
    CAST(digest_version AS BIGINT)           AS t_digest_version,
    CAST(extras_digest_version AS BIGINT)    AS t_extras_digest_version,
    {digest}                                 AS t_digest,
    {extras_digest}                          AS t_extras_digest,
    {chain_hash}                             AS t_chain_hash,
    {cumulative_hash}                        AS t_cumulative_hash,
    CAST(token_ids_delta AS BIGINT[])        AS t_token_ids,
    {mask}                                   AS t_mask,
    {logprobs}                               AS t_logprobs,
    filename                                 AS t_file,
    file_row_number                          AS t_row
FROM read_parquet({files}, filename = true, file_row_number = true, union_by_name = true, hive_partitioning = false)
