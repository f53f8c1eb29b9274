-- Benchmark fixture (scripts/benchmark.py --report-only): $nights nights of $rollouts
-- rollouts each, published by the run "bench", written straight into a warehouse; their
-- ledger rows (report_bench_ledger.sql) are written as the run's Parquet by the script.
INSERT INTO rollout_runs BY NAME
SELECT DATE '2026-11-28' - CAST(n AS INTEGER) AS ds, 'bench' AS run, r AS rollout_seq, 'r' || r AS rollout_id,
       'g' || (r // 8) AS group_id, CAST(r % 8 AS INTEGER) AS slot, 0.5 AS reward,
       '{"agent":"a' || (r % 3) || '","env":"e' || (r % 5) || '"}' AS metadata
FROM range($nights) t(n), range($rollouts) u(r);
INSERT INTO night_calls SELECT DISTINCT ds, 'bench' FROM rollout_runs;
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
INSERT INTO shard_plan_runs SELECT DISTINCT ds, group_id, 0, 'bench' FROM rollouts;
INSERT INTO runs BY NAME
SELECT 'bench' AS run_id, ds, now()::TIMESTAMP AS published_at, count(*) AS n_rollouts
FROM rollouts GROUP BY ds;
