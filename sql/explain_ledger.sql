-- The ledger rows of one rollout in capture order, shaped like shard_calls.sql's rows but
-- without token locations (the report's traces read no tokens).
SELECT r.group_id, l.rollout_id, l.capture_seq, l.model_call_id, l.parent_call_id, l.mode,
       l.prev_len, l.delta_len, l.cum_len, l.weight_version, l.schema_version,
       l.digest_version, l.extras_digest_version, l.digest, l.extras_digest, l.chain_hash,
       l.cumulative_hash, l.staging_key, l.response_id, l.output_items, l.output_fingerprint,
       l.fingerprint_version, l.failure_reason,
       NULL::VARCHAR AS t_file, NULL::BIGINT AS t_row
FROM ledger l
JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
WHERE l.ds = CAST($ds AS DATE) AND l.rollout_id = $rollout_id
ORDER BY l.capture_seq;
