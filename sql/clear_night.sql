-- A reload of one night replaces it: nothing is appended twice. (Its per-call rows are the
-- files of one run, which the load names once it commits: reassembler/call_tables.py.)
DELETE FROM rollouts   WHERE ds = $ds;
DELETE FROM shard_plan WHERE ds = $ds;
