-- Keep the per-night tables (rollout_runs, shard_plan_runs) and the per-call files (ledger,
-- token_rows: warehouse.py deletes the folders of the nights not in `kept_nights` once this
-- commits) of the newest $nights nights, of the night just loaded ($ds, which may be older:
-- a backfill) and of every night loaded in the last $hold_days days and not yet published (a
-- build in flight holds it); audit, runs, rejects and quality verdicts are kept for good.
-- Within a kept night, only the rows of its current run and of its latest load stay.
DELETE FROM loads WHERE loaded_at < now()::TIMESTAMP - to_days(CAST($hold_days AS INTEGER));
CREATE OR REPLACE TEMP TABLE kept_nights AS
    SELECT ds FROM (SELECT DISTINCT ds FROM rollout_runs ORDER BY ds DESC LIMIT $nights)
    UNION SELECT CAST($ds AS DATE)
    UNION SELECT ds FROM loads;
DELETE FROM shard_plan_runs WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM rollout_runs    WHERE ds NOT IN (SELECT ds FROM kept_nights);
DELETE FROM shard_plan_runs p
WHERE NOT EXISTS (SELECT 1 FROM night_calls c WHERE c.ds = p.ds AND c.run = p.run)
  AND NOT EXISTS (SELECT 1 FROM loads l WHERE l.ds = p.ds AND l.run = p.run);
DELETE FROM rollout_runs r
WHERE NOT EXISTS (SELECT 1 FROM night_calls c WHERE c.ds = r.ds AND c.run = r.run)
  AND NOT EXISTS (SELECT 1 FROM loads l WHERE l.ds = r.ds AND l.run = r.run);
