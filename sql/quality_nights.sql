-- One row per published night (the last $nights up to $ds; a night is published when a run
-- of it is recorded, even one of no rollout): the numbers of the report's headline and
-- trends. Tokens lost to masking are what the masked rollouts' ledger declares; rows lost
-- count one row per root of a masked rollout (each root would start a row).
WITH per_rollout AS (
    SELECT ds, rollout_id, sum(delta_len) AS declared_tokens
    FROM ledger GROUP BY ds, rollout_id
), nights AS (
    SELECT ds, arg_max(run_id, published_at) AS run_id, arg_max(inputs, published_at) AS inputs
    FROM runs WHERE ds <= CAST($ds AS DATE)
    GROUP BY ds ORDER BY ds DESC LIMIT $nights
)
SELECT n.ds,
       count(a.rollout_id)                                        AS rollouts,
       count(*) FILTER (a.status = 'ok')                          AS ok,
       count(*) FILTER (a.status = 'masked')                      AS masked,
       coalesce(count(*) FILTER (a.status = 'masked') / nullif(count(a.rollout_id), 0), 0) AS mask_rate,
       coalesce(sum(a.n_segments), 0)                             AS rows,
       coalesce(sum(a.n_tokens), 0)                               AS tokens,
       coalesce(sum(p.declared_tokens) FILTER (a.status = 'masked'), 0) AS tokens_lost,
       coalesce(sum(greatest(a.n_roots, 1)) FILTER (a.status = 'masked'), 0) AS rows_lost,
       count(*) FILTER (a.n_roots > 1)                            AS compacted,
       coalesce(sum(a.n_offchain), 0)                             AS offchain_calls,
       coalesce(sum(a.n_offchain_faults), 0)                      AS offchain_faults,
       (SELECT count(*) FROM rejects j WHERE j.ds = n.ds)         AS rejects,
       (SELECT count(*) FROM rejects j
         WHERE j.ds = n.ds AND starts_with(j.error, 'torn_final_line')) AS torn_lines,
       n.run_id                                                   AS run_id,
       any_value(n.inputs)                                        AS inputs
FROM nights n
LEFT JOIN audit a ON a.ds = n.ds
LEFT JOIN per_rollout p ON p.ds = a.ds AND p.rollout_id = a.rollout_id
GROUP BY n.ds, n.run_id
ORDER BY n.ds;
