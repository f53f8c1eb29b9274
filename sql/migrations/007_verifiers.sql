-- Version 6 -> 7 (contract v4): a verifiers trace's shape beside its rollout row (its rows'
-- node paths, sampled and root node counts, the policy versions: load/verifiers_traces.py).
-- Nights loaded before read no verifiers trace.
ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS trace VARCHAR;
