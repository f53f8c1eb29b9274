-- The keys of every token row of the night: which ledger row asks for it (staging_key) and
-- where it sits (file, row number). The other columns, token lists included, are read by
-- token_store.py for just the rows a batch needs, after the calls are sorted. {keep} leaves
-- out the row groups too big to decode (read.token_files).
SELECT
    CAST(staging_key AS VARCHAR)    AS t_staging_key,
    CAST(rollout_id AS VARCHAR)     AS t_rollout_id,
    CAST(model_call_id AS VARCHAR)  AS t_model_call_id,
    filename                        AS t_file,
    file_row_number                 AS t_row
FROM read_parquet({files}, filename = true, file_row_number = true, union_by_name = true,
                  hive_partitioning = false)
WHERE {keep}
