"""The night's merge: the load parts' tables (load/) into the night the shards read.

Three steps, none of which grows with the night's calls unless it runs per bucket:

1. `rollouts.py`, once: the global step over rollout and group keys (the parts' rollout rows
   and their counts of calls per rollout): repeated ids and Episodes, given-up samples, the
   capture each rollout is read from, numbering, slots and the shard ranges. Its decisions
   go to every bucket.
2. `keys.py`, per bucket of staging keys: each token row found by the ledger lines that ask
   for it, the token rows none asks for (reject rows).
3. `bucket.py`, per bucket of rollouts: the bucket's per-call tables (ledger, token rows,
   rejects) as Parquet beside the warehouse (call_tables.py), and its shard plan pieces.

`commit.py` then brings the night into the warehouse (its per-rollout tables, and which
run's per-call files it reads) and writes each shard's rollouts; each shard sorts its own
calls out of the buckets' pieces (`pieces.py`). Rows are split into buckets by buckets.py;
the outcome is the same for any number of parts and buckets.
"""
