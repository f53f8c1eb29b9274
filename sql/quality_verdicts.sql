-- The quality gate's verdicts of past nights (the report shows breaches).
SELECT ds, verdict, breaches, checked_at FROM quality
WHERE ds <= CAST($ds AS DATE)
ORDER BY ds DESC, checked_at DESC
LIMIT $nights;
