-- Benchmark (scripts/benchmark.py --scale-only): the write the merge cannot avoid while the
-- warehouse holds the per-call rows, with no check and no plan: the parts' rollouts, ledger
-- and token keys into a new DuckDB file, committed and checkpointed. $folder is the part.
CREATE TABLE rollouts AS SELECT * FROM read_parquet($folder || '/rollouts.parquet') LIMIT 0;
CREATE TABLE ledger AS SELECT * FROM read_parquet($folder || '/ledger.parquet') LIMIT 0;
CREATE TABLE token_keys AS SELECT * FROM read_parquet($folder || '/token_keys.parquet') LIMIT 0;
BEGIN TRANSACTION;
INSERT INTO rollouts SELECT * FROM read_parquet($folder || '/rollouts.parquet');
INSERT INTO ledger SELECT * FROM read_parquet($folder || '/ledger.parquet');
INSERT INTO token_keys SELECT * FROM read_parquet($folder || '/token_keys.parquet');
COMMIT;
CHECKPOINT;
