-- The global step's plan of the night (merge/rollouts.py), over per-rollout rows only:
-- `m_owned`: the derived calls each rollout keeps (`derived_owners`, counted per part in
-- `p_calls`) and where their numbers start: after every ledger line ($base), the calls of
-- rollout lines in rollout order, then local-mode calls by capture key, as one process
-- numbers them (the buckets number each rollout's own from there, in its capture order);
-- `m_groups`: each group's shard, its groups balanced by the tokens their calls declare (a
-- group never straddles two shards); `m_decisions`: what each bucket needs to know of a
-- rollout id: kept (a rollout of the night) or a failed attempt's (`failed_keys`), and of a
-- kept one the part and row of its line (`m_kept`: the buckets find its rollout_items there)
-- and its shard's sort bucket: the shard's rollouts in output order (group, slot, id)
-- cut into runs of about $bucket_rows rollout and call rows, between rollouts, never inside
-- one (a large group is cut too), which load/shard_plan.py and merge/pieces.py sort one at a
-- time.
CREATE OR REPLACE TEMP TABLE m_owned AS
SELECT o.part, o.rollout_id, o.kind, c.n_calls, c.delta_sum,
       $base + coalesce(sum(c.n_calls) OVER (ORDER BY o.kind = 'local', r.rollout_seq, o.rollout_id
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS derived_base
FROM derived_owners o
JOIN p_calls c ON c.part = o.part AND c.rollout_id = o.rollout_id AND c.capture = o.kind
LEFT JOIN rollouts r ON o.kind IN ('rebuilt', 'verifiers', 'envelope', 'art') AND r.rollout_id = o.rollout_id;
CREATE OR REPLACE TEMP TABLE m_rollout_calls AS
SELECT r.rollout_id, r.group_id, r.slot,
       coalesce(l.n_calls, 0) + coalesce(d.n_calls, 0) AS n_calls,
       coalesce(l.delta_sum, 0) + coalesce(d.delta_sum, 0) AS delta_sum
FROM rollouts r
LEFT JOIN (SELECT rollout_id, sum(n_calls) AS n_calls, sum(delta_sum) AS delta_sum
           FROM p_calls WHERE capture IS NULL GROUP BY rollout_id) l USING (rollout_id)
LEFT JOIN m_owned d USING (rollout_id);
CREATE OR REPLACE TEMP TABLE m_groups AS
WITH weights AS (
    SELECT group_id, sum(greatest(n_calls, 1)) + sum(delta_sum) AS weight
    FROM m_rollout_calls
    GROUP BY group_id
), running AS (
    SELECT group_id,
           coalesce(sum(weight) OVER (ORDER BY group_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
           sum(weight) OVER () AS total
    FROM weights
)
SELECT group_id, least($shards - 1, CAST(floor(before * $shards / total) AS INTEGER)) AS shard
FROM running;
CREATE OR REPLACE TEMP TABLE m_sort AS
SELECT c.rollout_id,
       CAST(coalesce(sum(1 + c.n_calls) OVER (
                PARTITION BY g.shard
                ORDER BY c.group_id ASC NULLS LAST, c.slot ASC NULLS LAST, c.rollout_id ASC NULLS LAST
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) // $bucket_rows AS BIGINT) AS sort_bucket
FROM m_rollout_calls c
JOIN m_groups g USING (group_id);
CREATE OR REPLACE TEMP TABLE m_decisions AS
SELECT r.rollout_id, true AS kept, r.rollout_id IN (SELECT rollout_id FROM failed_keys) AS failed,
       r.group_id, r.slot, g.shard, o.part AS owner_part, o.kind AS owner_kind, o.derived_base, s.sort_bucket,
       k.part AS line_part, k.rollout_seq AS line_seq
FROM rollouts r
JOIN m_groups g USING (group_id)
JOIN m_sort s USING (rollout_id)
LEFT JOIN m_owned o USING (rollout_id)
LEFT JOIN m_kept k USING (rollout_id)
UNION ALL
SELECT f.rollout_id, false, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM failed_keys f ANTI JOIN rollouts r USING (rollout_id);
