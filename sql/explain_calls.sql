SELECT model_call_id, parent_call_id, failure_reason
FROM ledger
WHERE ds = CAST($ds AS DATE) AND rollout_id = $rollout_id
ORDER BY capture_seq;
