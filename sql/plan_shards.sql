-- Split the night's groups into $shards contiguous ranges of group_id, balanced by the
-- number of tokens their ledger declares. A group never straddles two shards, so each
-- shard can compute its groups' advantages alone, and shard k's rows all sort before
-- shard k+1's.
INSERT INTO shard_plan
WITH weights AS (
    SELECT r.group_id, count(*) + sum(coalesce(l.delta_len, 0)) AS weight
    FROM rollouts r
    LEFT JOIN ledger l ON l.ds = r.ds AND l.rollout_id = r.rollout_id
    WHERE r.ds = $ds
    GROUP BY r.group_id
), running AS (
    SELECT group_id,
           coalesce(sum(weight) OVER (ORDER BY group_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
           sum(weight) OVER () AS total
    FROM weights
)
SELECT CAST($ds AS DATE), group_id,
       least($shards - 1, CAST(floor(before * $shards / total) AS INTEGER))
FROM running;
