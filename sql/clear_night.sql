-- A reload of one night replaces it: nothing is appended twice.
DELETE FROM rollouts   WHERE ds = $ds;
DELETE FROM ledger     WHERE ds = $ds;
DELETE FROM rejects    WHERE ds = $ds;
DELETE FROM shard_plan WHERE ds = $ds;
DELETE FROM token_rows WHERE ds = $ds;
