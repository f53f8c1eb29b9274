-- Keep the per-night tables (rollouts, shard_plan) and the per-call files (ledger, token_rows:
-- warehouse.py deletes the folders of the nights not in `kept_nights` once this commits)
-- of the newest $nights nights, of the night just loaded ($ds, which may be older: a
-- backfill) and of every night loaded in the last $hold_days days and not yet published (a
-- build in flight holds it); audit, runs, rejects and quality verdicts are kept for good.
DELETE FROM loads WHERE loaded_at < now()::TIMESTAMP - to_days(CAST($hold_days AS INTEGER));
CREATE OR REPLACE TEMP TABLE kept_nights AS
    SELECT ds FROM (SELECT DISTINCT ds FROM rollouts ORDER BY ds DESC LIMIT $nights)
    UNION SELECT CAST($ds AS DATE)
    UNION SELECT ds FROM loads;
DELETE FROM shard_plan WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM rollouts   WHERE ds NOT IN (SELECT ds FROM kept_nights);
