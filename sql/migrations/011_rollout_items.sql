-- Version 10 -> 11: a rollout's fields that grow with its calls (generated_items,
-- model_items, trace) leave the rollout rows for the per-call table rollout_items beside the
-- warehouse (reassembler/call_tables.py). warehouse.py has written them out as the file
-- migrated.parquet of each night and run before this runs; the view rollouts is defined
-- again once the schema is current.
DROP VIEW IF EXISTS rollouts;
ALTER TABLE rollout_runs DROP COLUMN generated_items;
ALTER TABLE rollout_runs DROP COLUMN model_items;
ALTER TABLE rollout_runs DROP COLUMN trace;
