-- Masked rollouts of one night by reason, most frequent first.
SELECT reason, count(*) AS n
FROM read_parquet($audit_files, hive_partitioning = false)
WHERE status = 'masked'
GROUP BY reason
ORDER BY n DESC, reason;
