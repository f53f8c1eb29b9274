-- One bucket of rollouts (merge/bucket.py), its rows in the night tables (call_tables.py):
-- `p_ledger`, `p_rejects`: the parts' rows of the bucket, each with its part; `matches`: the
-- token rows its calls' staging keys find (merge/keys.py); `decisions`: the global step's per
-- rollout id (merge/rollouts.py); `part_bases`: the ledger lines of the parts before each part.
-- Ledger lines: every one, numbered in the night's reading order (each part numbered its own
-- from 1); those of no rollout of the night and of no failed attempt are reject rows too.
INSERT INTO ledger BY NAME
SELECT CAST($ds AS DATE) AS ds, l.* EXCLUDE (part, capture_seq), l.capture_seq + b.base AS capture_seq
FROM p_ledger l JOIN part_bases b USING (part)
WHERE l.capture IS NULL;
-- Derived calls: those of the part and kind each rollout keeps, numbered from its
-- derived_base in its own capture order; their token rows' keys go with them.
CREATE OR REPLACE TEMP TABLE m_derived AS
SELECT l.*, d.derived_base + row_number() OVER (PARTITION BY l.rollout_id ORDER BY l.capture_seq) AS n
FROM p_ledger l
JOIN decisions d ON d.kept AND d.owner_part = l.part AND d.rollout_id = l.rollout_id AND d.owner_kind = l.capture
WHERE l.capture IS NOT NULL;
INSERT INTO ledger BY NAME
SELECT CAST($ds AS DATE) AS ds, * EXCLUDE (part, capture_seq, n), n AS capture_seq FROM m_derived;
-- each call's token rows: a ledger line's as found, a derived call's of its own part
CREATE OR REPLACE TEMP TABLE m_tokens AS
SELECT rollout_id, t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row, part FROM matches WHERE part IS NULL
UNION ALL
SELECT k.rollout_id, k.t_staging_key, k.t_rollout_id, k.t_model_call_id, k.t_file, k.t_row, k.part
FROM matches k SEMI JOIN m_derived d ON d.part = k.part AND d.rollout_id = k.rollout_id AND d.staging_key = k.t_staging_key
WHERE k.part IS NOT NULL;
INSERT INTO token_rows
SELECT CAST($ds AS DATE), t_staging_key, t_rollout_id, t_model_call_id, t_file, t_row FROM m_tokens WHERE part IS NOT NULL;
DROP TABLE m_derived;
INSERT INTO rejects BY NAME SELECT CAST($ds AS DATE) AS ds, * EXCLUDE (part) FROM p_rejects;
INSERT INTO rejects BY NAME
SELECT l.ds, 'ledger' AS source, l.source_file AS file, l.source_line AS line,
       'no rollout record for rollout_id ' || l.rollout_id AS error, NULL AS raw,
       l.rollout_id, l.model_call_id
FROM ledger l ANTI JOIN decisions d ON d.rollout_id = l.rollout_id
WHERE l.capture IS NULL AND l.rollout_id IS NOT NULL;
-- Rollout items: the fields that grow with a rollout's calls (formats/fields.py: ITEMS), of
-- each rollout the night keeps, from the part and row of its line (`decisions`: line_part,
-- line_seq); a given-up sample (no line) has none.
INSERT INTO rollout_items BY NAME
SELECT CAST($ds AS DATE) AS ds, i.* EXCLUDE (part, rollout_seq)
FROM p_rollout_items i
JOIN decisions d ON d.kept AND d.line_part = i.part AND d.line_seq = i.rollout_seq;
