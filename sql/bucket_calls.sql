-- One bucket's plan pieces (merge/bucket.py): every call of a rollout of the night with the
-- token rows its staging key finds (`m_tokens`, sql/bucket_merge.sql: a call without one
-- comes once with null t_ columns, a call with several once per token row), its rollout's
-- group, slot, shard and sort bucket; the shard sorts them (merge/pieces.py). The call columns are reassembler/formats/fields.py's CALL.
SELECT d.group_id, {call_columns}, t.t_file, t.t_row, d.slot AS plan_slot, d.shard AS plan_shard,
       d.sort_bucket AS plan_bucket
FROM ledger l
JOIN decisions d ON d.kept AND d.rollout_id = l.rollout_id
LEFT JOIN m_tokens t ON t.rollout_id = l.rollout_id AND t.t_staging_key = l.staging_key
