-- Ledger rows whose rollout has no rollout record cannot be audited: keep them as rejects,
-- except the rows of a failed attempt that a failures file names (`failed_attempts`,
-- CONTRACT.md 2.1): they belong to it and produce nothing.
INSERT INTO rejects BY NAME
SELECT l.ds, 'ledger' AS source, l.source_file AS file, l.source_line AS line,
       'no rollout record for rollout_id ' || l.rollout_id AS error, NULL AS raw,
       l.rollout_id, l.model_call_id
FROM ledger l ANTI JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
WHERE l.ds = $ds AND l.rollout_id NOT IN (SELECT rollout_id FROM failed_attempts);
