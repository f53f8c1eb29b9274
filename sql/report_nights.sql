-- Capture quality night by night, from the published audit rows kept in the warehouse.
SELECT a.ds,
       count(*)                                        AS rollouts,
       count(*) FILTER (status = 'ok')                 AS ok,
       count(*) FILTER (status = 'masked')             AS masked,
       round(count(*) FILTER (status = 'masked') / count(*), 4) AS mask_rate,
       sum(n_segments)                                 AS rows,
       count(*) FILTER (n_roots > 1)                   AS compacted,
       sum(n_offchain_faults)                          AS offchain_faults,
       (SELECT count(*) FROM rejects j WHERE j.ds = a.ds) AS rejects,
       any_value(run_id)                               AS run_id
FROM audit a
GROUP BY a.ds
ORDER BY a.ds;
