-- Masked rollouts by night and reason.
SELECT ds, reason, count(*) AS n
FROM audit
WHERE status = 'masked'
GROUP BY ds, reason
ORDER BY ds, n DESC, reason;
