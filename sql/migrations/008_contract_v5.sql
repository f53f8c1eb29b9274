-- Version 7 -> 8 (contract v5): where a rollout came from (5.3) beside its rollout row, and
-- on its published audit row. Nights loaded before have them null: their rows were written
-- without these columns.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS evidence VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS env VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS agent VARCHAR;
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS temperature DOUBLE;
ALTER TABLE audit ADD COLUMN IF NOT EXISTS capture VARCHAR;
ALTER TABLE audit ADD COLUMN IF NOT EXISTS evidence VARCHAR;
