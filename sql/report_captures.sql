-- Rollouts of each published night by the capture they were read from (CONTRACT.md 9), with
-- how many were masked; a night past the per-call retention shows its rollouts as unknown.
SELECT a.ds, coalesce(r.capture, 'unknown') AS capture, count(*) AS rollouts,
       count(*) FILTER (a.status = 'masked') AS masked
FROM audit a
LEFT JOIN rollouts r ON r.ds = a.ds AND r.rollout_id = a.rollout_id
GROUP BY ALL
ORDER BY a.ds, capture;
