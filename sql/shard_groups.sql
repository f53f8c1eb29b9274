-- The group ids one shard of a night holds (the mapped task's label).
SELECT group_id FROM shard_plan WHERE ds = CAST($ds AS DATE) AND shard = $shard ORDER BY group_id;
