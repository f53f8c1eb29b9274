-- Every ledger row of one shard joined with the location of its token rows (file, row
-- number: load/token_keys.py, or night_token_rows.sql once loaded), unordered: each row has
-- its rollout's slot and the bucket of its group (plan_buckets.sql, or none: no_buckets.sql), and load/shard_plan.py sorts a
-- bucket at a time into output order then capture order (CALL_ORDER), never the whole shard.
-- A call without a token row comes once with null t_ columns; a call with several comes once
-- per token row. $rollout_id (explain) narrows it to one rollout. The call columns are
-- reassembler/fields.py's CALL.
SELECT r.group_id, {call_columns},
       t.t_file, t.t_row, r.slot AS plan_slot, b.bucket AS plan_bucket
FROM ledger l
JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
JOIN shard_plan p ON p.ds = r.ds AND p.group_id = r.group_id
LEFT JOIN {buckets} b ON b.group_id = r.group_id
LEFT JOIN ({tokens}) t ON t.t_staging_key = l.staging_key
WHERE l.ds = $ds AND ($shard IS NULL OR p.shard = $shard)
  AND ($rollout_id IS NULL OR l.rollout_id = $rollout_id);
