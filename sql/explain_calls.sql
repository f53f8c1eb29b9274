-- The ledger rows of one rollout in capture order, with where each was read from.
SELECT model_call_id, parent_call_id, failure_reason, source_file, source_line, capture
FROM ledger
WHERE ds = CAST($ds AS DATE) AND rollout_id = $rollout_id
ORDER BY capture_seq;
