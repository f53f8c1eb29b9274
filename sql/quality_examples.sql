-- A few masked rollouts of each reason on one night, the first ones in output order.
SELECT reason, rollout_id, failed_call_id, detail
FROM audit
WHERE ds = CAST($ds AS DATE) AND status = 'masked'
QUALIFY row_number() OVER (PARTITION BY reason ORDER BY group_id, slot, rollout_id) <= $per_reason
ORDER BY reason, group_id, slot, rollout_id;
