-- The rollouts of one shard, each with the bucket it is sorted in (load/shard_plan.py): the
-- sort bucket the merge's global step gave it (sql/merge_plan.sql: runs of about
-- load/shard_plan.py's BUCKET_ROWS rollout and call rows, in output order). `night_sort`: the
-- merge's decisions (rollout_id, kept, shard, sort_bucket). One narrow row per rollout.
SELECT rollout_id, sort_bucket AS bucket
FROM night_sort
WHERE kept AND shard = $shard
