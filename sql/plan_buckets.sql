-- The groups of one shard, each with the bucket it is sorted in (load/shard_plan.py): groups
-- in output order, cut into buckets of about $bucket_rows rollout and call rows, whole groups
-- each (a group larger than that is a bucket of its own). `night_groups`: the merge's groups
-- (merge/rollouts.py: group_id, shard, n_rows). One narrow row per group.
SELECT group_id,
       CAST(coalesce(sum(n_rows) OVER (ORDER BY group_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
            // $bucket_rows AS BIGINT) AS bucket
FROM night_groups
WHERE shard = $shard
