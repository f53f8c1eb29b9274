-- Every ledger row of one shard joined with the location of its token rows (file, row
-- number: load/token_keys.py, or night_token_rows.sql once loaded), in output order then
-- capture order. A call without a token row comes once with null t_ columns; a call with
-- several comes once per token row. $first_group..$last_group narrows it to a slice of the
-- shard's groups (shard_slices.sql), so that DuckDB sorts one slice at a time;
-- $rollout_id (explain) to one rollout. The call columns are reassembler/fields.py's CALL.
SELECT r.group_id, {call_columns},
       t.t_file, t.t_row
FROM ledger l
JOIN rollouts r ON r.ds = l.ds AND r.rollout_id = l.rollout_id
JOIN shard_plan p ON p.ds = r.ds AND p.group_id = r.group_id
LEFT JOIN ({tokens}) t ON t.t_staging_key = l.staging_key
WHERE l.ds = $ds AND ($shard IS NULL OR p.shard = $shard)
  AND ($first_group IS NULL OR r.group_id BETWEEN $first_group AND $last_group)
  AND ($rollout_id IS NULL OR l.rollout_id = $rollout_id)
ORDER BY r.group_id, r.slot, r.rollout_id, l.capture_seq, t.t_file, t.t_row;
