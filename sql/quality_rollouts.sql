-- One row per rollout of one night with what the breakdowns group by: the capture it was read
-- from (staged, local, rebuilt, verifiers, envelope, art; none), its agent and env, its weight version (the highest its ledger declares),
-- model server (the ledger subfolder of its first row, else the metadata key model_server),
-- metadata, size in calls and declared tokens; audit_capture is the audit table's own (the
-- masked-rollout downloads carry it as it is).
WITH calls AS (
    SELECT rollout_id,
           max(weight_version)                                    AS weight_version,
           arg_min(CASE WHEN contains(source_file, '/') THEN split_part(source_file, '/', 1) END,
                   capture_seq)                                    AS folder,
           sum(delta_len)                                         AS declared_tokens
    FROM ledger WHERE ds = CAST($ds AS DATE)
    GROUP BY rollout_id
)
SELECT a.rollout_id, a.group_id, a.slot, a.status, a.reason, a.detail, a.failed_call_id,
       a.n_ledger_calls, a.n_roots, a.n_segments, a.n_tokens,
       a.n_offchain, a.n_offchain_faults, a.metadata, a.capture AS audit_capture, a.reward,
       c.weight_version,
       coalesce(c.folder, json_extract_string(a.metadata, '$.model_server')) AS model_server,
       coalesce(c.declared_tokens, 0) AS declared_tokens,
       coalesce(r.capture, 'unknown') AS capture,
       coalesce(r.agent, json_extract_string(a.metadata, '$.agent')) AS agent,
       coalesce(r.env, json_extract_string(a.metadata, '$.env')) AS env
FROM audit a
LEFT JOIN calls c USING (rollout_id)
LEFT JOIN (SELECT rollout_id, capture, agent, env FROM rollouts WHERE ds = CAST($ds AS DATE)) r USING (rollout_id)
WHERE a.ds = CAST($ds AS DATE)
ORDER BY a.group_id, a.slot, a.rollout_id;
