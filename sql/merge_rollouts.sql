-- The load parts' rollout rows (`p_rollouts`: each part's, numbered in its own reading order
-- by rollout_seq) merged: the first line of each rollout_id in the night's reading order
-- (parts in order, then their rows) is kept, renumbered across the night; `m_kept` names
-- the part each kept row came from, `m_repeated` the lines of an id an earlier part holds.
-- The windows see only the narrow key columns (a row's outputs can be kilobytes): the wide
-- rows are joined to their new number once, so the merge's memory stays bounded.
CREATE OR REPLACE TEMP TABLE m_ranked AS
SELECT part, rollout_seq, rollout_id, capture, source_file, source_line,
       row_number() OVER (PARTITION BY rollout_id ORDER BY part, rollout_seq) AS occurrence
FROM p_rollouts;
CREATE OR REPLACE TEMP TABLE m_kept AS
SELECT part, rollout_seq, rollout_id, capture, row_number() OVER (ORDER BY part, rollout_seq) AS night_seq
FROM m_ranked WHERE occurrence = 1;
INSERT INTO rollouts BY NAME
SELECT CAST($ds AS DATE) AS ds, p.* EXCLUDE (part, rollout_seq), k.night_seq AS rollout_seq
FROM p_rollouts p JOIN m_kept k USING (part, rollout_seq);
CREATE OR REPLACE TEMP TABLE m_repeated AS
SELECT part, source_file, source_line, rollout_id FROM m_ranked WHERE occurrence > 1;
DROP TABLE m_ranked;
