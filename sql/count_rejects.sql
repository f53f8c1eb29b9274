-- Rejected input rows of one night, per source (rollouts, ledger, tokens).
SELECT source, count(*) FROM rejects WHERE ds = $ds GROUP BY source;
