-- The published audit row of one rollout, and the build options of the run that wrote it.
SELECT a.status, a.reason, a.detail, a.failed_call_id, a.advantage, a.run_id,
       r.input_dir, r.mode, r.offchain, r.options
FROM audit a
LEFT JOIN runs r ON r.run_id = a.run_id AND r.ds = a.ds
WHERE a.ds = CAST($ds AS DATE) AND a.rollout_id = $rollout_id
ORDER BY r.published_at DESC
LIMIT 1;
