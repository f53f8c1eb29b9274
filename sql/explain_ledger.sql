-- The ledger rows of one rollout in capture order, shaped like shard_calls.sql's rows but
-- without token locations (the report's traces read no tokens). The call columns: fields.py's CALL.
SELECT r.group_id, {call_columns},
       NULL::VARCHAR AS t_file, NULL::BIGINT AS t_row
FROM ledger l
JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
WHERE l.ds = CAST($ds AS DATE) AND l.rollout_id = $rollout_id
ORDER BY l.capture_seq;
