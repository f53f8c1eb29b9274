-- Per rollout of one night, its ledger lines that were rejected: how many, and the first
-- (file:line: error), as the buckets write them (merge/bucket.py: rollout_rejects.parquet).
(SELECT rollout_id, count(*) AS n_rejected, arg_min(file || ':' || line || ': ' || error, (file, line)) AS first_rejected
 FROM rejects
 WHERE ds = $ds AND source = 'ledger'
 GROUP BY rollout_id)
