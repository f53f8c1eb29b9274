-- Version 4 -> 5 (contract v3): which capture the load read for each rollout and what its
-- own checks found (NeMo Gym's local mode and rebuilt lines), and the local-mode entries'
-- verdicts on their ledger rows. Nights loaded before read staged capture only.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS capture VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS capture_reason VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS capture_detail VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS capture_call_id VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS n_token_items INTEGER;
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS capture VARCHAR;
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS entry_fault VARCHAR;
ALTER TABLE ledger ADD COLUMN IF NOT EXISTS entry_detail VARCHAR;
