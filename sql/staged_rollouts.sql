-- The rollouts of the night that have ledger rows of their own (staged capture).
SELECT DISTINCT rollout_id FROM ledger WHERE ds = CAST($ds AS DATE) AND capture IS NULL
