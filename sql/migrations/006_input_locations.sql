-- Version 5 -> 6: the input locations each published run read (formats/locations.py), as
-- JSON {"rollouts": ..., "ledger": ..., "tokens": ...}. Runs published before hold null:
-- their input_dir is the root of the contract's layout.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS inputs VARCHAR;
