-- One bucket's rollout items as plan pieces (merge/bucket.py): every rollout of the night in
-- the bucket, with its items (null: none, sql/bucket_merge.sql), its shard and sort bucket,
-- and the keys of its output order (load/shard_plan.py: ROLLOUT_ORDER); a shard sorts them
-- into the order of its rollouts (merge/pieces.py), one row each.
SELECT d.rollout_id, i.generated_items, i.model_items, i.trace,
       d.group_id AS plan_group, d.slot AS plan_slot, d.shard AS plan_shard, d.sort_bucket AS plan_bucket
FROM decisions d
LEFT JOIN rollout_items i USING (rollout_id)
WHERE d.kept
