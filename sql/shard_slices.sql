-- The groups of one shard in output order, each with its number of ledger rows: the shard
-- reads its calls (shard_calls.sql) in slices of whole groups cut from this list.
SELECT p.group_id, count(l.rollout_id) AS calls
FROM shard_plan p
JOIN rollouts r ON r.ds = p.ds AND r.group_id = p.group_id
LEFT JOIN ledger l ON l.ds = r.ds AND l.rollout_id = r.rollout_id
WHERE p.ds = CAST($ds AS DATE) AND p.shard = $shard
GROUP BY p.group_id
ORDER BY p.group_id;
