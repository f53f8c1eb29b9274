-- The range of group ids one shard of a night holds (the mapped task's label).
SELECT min(group_id), max(group_id), count(*) FROM shard_plan WHERE ds = CAST($ds AS DATE) AND shard = $shard;
