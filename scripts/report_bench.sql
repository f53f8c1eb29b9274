-- Benchmark fixture (scripts/benchmark.py --report-only): $nights nights of $rollouts
-- rollouts each, $calls ledger rows per rollout, written straight into a warehouse.
INSERT INTO rollouts BY NAME
SELECT DATE '2026-11-28' - CAST(n AS INTEGER) AS ds, r AS rollout_seq, 'r' || r AS rollout_id,
       'g' || (r // 8) AS group_id, CAST(r % 8 AS INTEGER) AS slot, 0.5 AS reward,
       '{"agent":"a' || (r % 3) || '","env":"e' || (r % 5) || '"}' AS metadata
FROM range($nights) t(n), range($rollouts) u(r);
INSERT INTO ledger BY NAME
SELECT ds, rollout_seq * 100 + c AS capture_seq, rollout_id, 'c' || c AS model_call_id,
       CASE WHEN c = 0 THEN NULL ELSE 'c' || (c - 1) END AS parent_call_id,
       CAST(3 + rollout_seq % 3 AS BIGINT) AS weight_version, CAST(400 + (rollout_seq * 7 + c) % 900 AS BIGINT) AS delta_len,
       rollout_id || '/c' || c AS staging_key,
       'server-' || (rollout_seq % 4) || '/' || rollout_id || '.lineage.jsonl' AS source_file
FROM rollouts, range($calls) t(c);
INSERT INTO audit BY NAME
SELECT ds, rollout_id, group_id, slot,
       CASE WHEN hash(rollout_id, ds) % 100 < 12 THEN 'masked' ELSE 'ok' END AS status,
       CASE WHEN hash(rollout_id, ds) % 100 < 12 THEN
            ['unmatched_output', 'broken_chain', 'digest_mismatch', 'missing_tokens'][CAST(1 + hash(rollout_id) % 4 AS BIGINT)] END AS reason,
       'detail' AS detail, CAST($calls AS INTEGER) AS n_ledger_calls, CAST(1 + CAST(rollout_seq % 5 = 0 AS INTEGER) AS INTEGER) AS n_roots,
       CAST(1 + CAST(rollout_seq % 5 = 0 AS INTEGER) AS INTEGER) AS n_segments, 0 AS n_offchain, 0 AS n_offchain_faults,
       CAST(5000 AS BIGINT) AS n_tokens, CAST(2000 AS BIGINT) AS n_generated, reward, 0.0 AS advantage, metadata,
       'bench' AS run_id
FROM rollouts;
INSERT INTO shard_plan SELECT DISTINCT ds, group_id, 0 FROM rollouts;
INSERT INTO runs BY NAME
SELECT 'bench' AS run_id, ds, now()::TIMESTAMP AS published_at, count(*) AS n_rollouts
FROM rollouts GROUP BY ds;
