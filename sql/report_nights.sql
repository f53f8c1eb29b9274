-- Capture quality night by night, from the published audit rows kept in the warehouse; a
-- night is published when a run of it is recorded (a night of no rollout shows zeros).
WITH nights AS (
    SELECT ds, arg_max(run_id, published_at) AS run_id FROM runs GROUP BY ds
)
SELECT n.ds,
       count(a.rollout_id)                                        AS rollouts,
       count(*) FILTER (a.status = 'ok')                          AS ok,
       count(*) FILTER (a.status = 'masked')                      AS masked,
       coalesce(round(count(*) FILTER (a.status = 'masked') / nullif(count(a.rollout_id), 0), 4), 0) AS mask_rate,
       coalesce(sum(a.n_segments), 0)                             AS rows,
       count(*) FILTER (a.n_roots > 1)                            AS compacted,
       coalesce(sum(a.n_offchain_faults), 0)                      AS offchain_faults,
       (SELECT count(*) FROM rejects j WHERE j.ds = n.ds)         AS rejects,
       n.run_id                                                   AS run_id
FROM nights n
LEFT JOIN audit a ON a.ds = n.ds
GROUP BY n.ds, n.run_id
ORDER BY n.ds;
