-- Masked rollouts of one night by reason, most frequent first.
SELECT reason, count(*) AS n
FROM staged_audit
WHERE status = 'masked'
GROUP BY reason
ORDER BY n DESC, reason;
