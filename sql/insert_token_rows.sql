-- The keys of every token row of the night (sql/token_files.sql), read from the files once.
INSERT INTO token_rows
SELECT CAST($ds AS DATE), t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM ({tokens}) t;
