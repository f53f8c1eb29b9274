-- Keep the per-call tables (rollouts, ledger, shard_plan, token_rows) of the newest $nights nights only;
-- audit, runs, rejects and quality verdicts are kept for good.
CREATE OR REPLACE TEMP TABLE kept_nights AS
    SELECT DISTINCT ds FROM rollouts ORDER BY ds DESC LIMIT $nights;
DELETE FROM ledger     WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM shard_plan WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM token_rows WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM rollouts   WHERE ds NOT IN (SELECT ds FROM kept_nights);
DROP TABLE kept_nights;
