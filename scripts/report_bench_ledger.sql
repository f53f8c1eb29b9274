-- Benchmark fixture (scripts/benchmark.py --report-only): the ledger rows of one night
-- ($ds), $calls per rollout of report_bench.sql's, in the per-call table's columns.
SELECT rollout_seq * 100 + c AS capture_seq, rollout_id, 'c' || c AS model_call_id,
       CASE WHEN c = 0 THEN NULL ELSE 'c' || (c - 1) END AS parent_call_id,
       CAST(3 + rollout_seq % 3 AS BIGINT) AS weight_version, CAST(400 + (rollout_seq * 7 + c) % 900 AS BIGINT) AS delta_len,
       rollout_id || '/c' || c AS staging_key,
       'server-' || (rollout_seq % 4) || '/' || rollout_id || '.lineage.jsonl' AS source_file
FROM rollouts, range($calls) t(c)
WHERE ds = CAST($ds AS DATE)
ORDER BY rollout_id, capture_seq
