-- The token rows of row groups too big to decode (read.token_files): reject rows that say
-- why, read from the key columns only. `too_big` is registered by the load: file, first and
-- last row, and the reason of each such row group.
INSERT INTO rejects BY NAME
SELECT CAST($ds AS DATE) AS ds, 'tokens' AS source, replace(t.t_file, $token_dir, '') AS file, t.t_row AS line,
       b.why AS error, t.t_staging_key AS raw, t.t_rollout_id AS rollout_id, t.t_model_call_id AS model_call_id
FROM ({tokens}) t
JOIN too_big b ON b.file = t.t_file AND t.t_row BETWEEN b.first_row AND b.last_row;
