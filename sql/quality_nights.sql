-- One row per published night (the last $nights up to $ds): the numbers of the report's
-- headline and trends. Tokens lost to masking are what the masked rollouts' ledger declares;
-- rows lost count one row per root of a masked rollout (each root would start a row).
WITH per_rollout AS (
    SELECT ds, rollout_id, sum(delta_len) AS declared_tokens
    FROM ledger GROUP BY ds, rollout_id
), nights AS (
    SELECT DISTINCT ds FROM audit WHERE ds <= CAST($ds AS DATE) ORDER BY ds DESC LIMIT $nights
)
SELECT a.ds,
       count(*)                                                   AS rollouts,
       count(*) FILTER (a.status = 'ok')                          AS ok,
       count(*) FILTER (a.status = 'masked')                      AS masked,
       coalesce(count(*) FILTER (a.status = 'masked') / nullif(count(*), 0), 0) AS mask_rate,
       coalesce(sum(a.n_segments), 0)                             AS rows,
       coalesce(sum(a.n_tokens), 0)                               AS tokens,
       coalesce(sum(p.declared_tokens) FILTER (a.status = 'masked'), 0) AS tokens_lost,
       coalesce(sum(greatest(a.n_roots, 1)) FILTER (a.status = 'masked'), 0) AS rows_lost,
       count(*) FILTER (a.n_roots > 1)                            AS compacted,
       coalesce(sum(a.n_offchain), 0)                             AS offchain_calls,
       coalesce(sum(a.n_offchain_faults), 0)                      AS offchain_faults,
       (SELECT count(*) FROM rejects j WHERE j.ds = a.ds)         AS rejects,
       any_value(a.run_id)                                        AS run_id
FROM audit a
JOIN nights USING (ds)
LEFT JOIN per_rollout p ON p.ds = a.ds AND p.rollout_id = a.rollout_id
GROUP BY a.ds
ORDER BY a.ds;
