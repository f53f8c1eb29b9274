-- The rollouts of one shard, each with the first ledger line of its own that had to be
-- rejected (the fragment `rejected`: sql/ledger_rejected.sql, or the buckets' pieces; such a rollout is
-- masked: its ledger is incomplete), unordered: each row has the
-- sort bucket (plan_buckets.sql, or none: no_buckets.sql), and load/shard_plan.py sorts a bucket
-- at a time into output order (ROLLOUT_ORDER). $run: the run that loaded them (the load's
-- shard plans), or null: the night's current run (explain, which $rollout_id narrows to one rollout).
SELECT r.rollout_id, r.group_id, r.slot, r.reward, r.reward_problem, r.failure_reason,
       r.terminal_model_call_id, r.terminal_response_id,
       r.metadata, r.capture, r.capture_reason, r.capture_detail, r.capture_call_id, r.n_token_items,
       r.evidence, r.env, r.agent, r.temperature,
       r.source_file, r.source_line,
       rej.n_rejected, rej.first_rejected, b.bucket AS plan_bucket
FROM rollout_runs r
JOIN shard_plan_runs p ON p.ds = r.ds AND p.run = r.run AND p.group_id = r.group_id
LEFT JOIN {buckets} b ON b.rollout_id = r.rollout_id
LEFT JOIN {rejected} rej ON rej.rollout_id = r.rollout_id
WHERE r.ds = $ds AND r.run = coalesce($run, (SELECT c.run FROM night_calls c WHERE c.ds = r.ds))
  AND ($shard IS NULL OR p.shard = $shard)
  AND ($rollout_id IS NULL OR r.rollout_id = $rollout_id);
