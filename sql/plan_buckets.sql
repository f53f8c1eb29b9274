-- The groups of one shard, each with the bucket it is sorted in (load/shard_plan.py): groups
-- in output order, cut into buckets of about $bucket_rows rollout and call rows, whole groups
-- each (a group larger than that is a bucket of its own). One narrow row per group.
WITH sizes AS (
    SELECT p.group_id, count(DISTINCT r.rollout_id) + count(l.rollout_id) AS n_rows
    FROM shard_plan p
    JOIN rollouts r ON r.ds = p.ds AND r.group_id = p.group_id
    LEFT JOIN ledger l ON l.ds = r.ds AND l.rollout_id = r.rollout_id
    WHERE p.ds = CAST($ds AS DATE) AND p.shard = $shard
    GROUP BY p.group_id
)
SELECT group_id,
       CAST(coalesce(sum(n_rows) OVER (ORDER BY group_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
            // $bucket_rows AS BIGINT) AS bucket
FROM sizes
