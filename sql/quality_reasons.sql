-- Masked rollouts per night and reason, for the last $nights nights up to $ds.
WITH nights AS (
    SELECT DISTINCT ds FROM audit WHERE ds <= CAST($ds AS DATE) ORDER BY ds DESC LIMIT $nights
)
SELECT ds, reason, count(*) AS n
FROM audit JOIN nights USING (ds)
WHERE status = 'masked'
GROUP BY ds, reason
ORDER BY ds, n DESC, reason;
