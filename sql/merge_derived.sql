-- The calls the load derived (NeMo Gym's rebuilt lines, envelope lines and local-mode captures, verifiers'
-- trace nodes) that the night keeps: those of the part and kind `derived_owners` names for
-- each rollout (the part of its kept line, or of the capture it is read from), numbered
-- after every ledger line ($base): the calls of rollout lines in rollout order, then
-- local-mode calls by capture key, each rollout's in its own capture order. Their token
-- rows' keys go with them.
CREATE OR REPLACE TEMP TABLE m_derived AS
SELECT l.*, row_number() OVER (ORDER BY l.capture = 'local', r.rollout_seq, l.rollout_id, l.capture_seq) AS n
FROM p_ledger l
JOIN derived_owners o ON o.part = l.part AND o.rollout_id = l.rollout_id AND o.kind = l.capture
LEFT JOIN (SELECT rollout_id, rollout_seq FROM rollouts WHERE ds = CAST($ds AS DATE)) r
       ON l.capture IN ('rebuilt', 'verifiers', 'envelope') AND r.rollout_id = l.rollout_id
WHERE l.capture IS NOT NULL;
INSERT INTO ledger BY NAME
SELECT CAST($ds AS DATE) AS ds, * EXCLUDE (part, capture_seq, n), $base + n AS capture_seq FROM m_derived;
INSERT INTO token_rows
SELECT CAST($ds AS DATE), k.t_staging_key, k.t_rollout_id, k.t_model_call_id, k.t_file, k.t_row
FROM p_derived_keys k SEMI JOIN m_derived d ON d.part = k.part AND d.staging_key = k.t_staging_key;
DROP TABLE m_derived;
