-- The calls of one rollout as a shard reads them, for `reassembler explain` (the shards' own
-- come from the merge's buckets: sql/bucket_calls.sql): every ledger row joined with the
-- location of its token rows (file, row number: the fragment `tokens`, the token files as they
-- are now, or none for a derived capture), each with its rollout's slot and no bucket
-- (no_buckets.sql); load/shard_plan.py sorts them into CALL_ORDER. A call without a token
-- row comes once with null t_ columns; a call with several comes once per token row. The
-- call columns are reassembler/formats/fields.py's CALL.
SELECT r.group_id, {call_columns},
       t.t_file, t.t_row, r.slot AS plan_slot, b.bucket AS plan_bucket
FROM ledger l
JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
JOIN shard_plan p ON p.ds = r.ds AND p.group_id = r.group_id
LEFT JOIN {buckets} b ON b.rollout_id = r.rollout_id
LEFT JOIN ({tokens}) t ON t.t_staging_key = l.staging_key
WHERE l.ds = $ds AND ($shard IS NULL OR p.shard = $shard)
  AND ($rollout_id IS NULL OR l.rollout_id = $rollout_id);
