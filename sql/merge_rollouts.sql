-- The load parts' rollout rows (`p_rollouts`: each part's, numbered in its own reading order
-- by rollout_seq) merged: the first line of each rollout_id in the night's reading order
-- (parts in order, then their rows) is kept, renumbered across the night; `m_kept` names
-- the part each kept row came from, `m_repeated` the lines of an id an earlier part holds.
-- A verifiers Episode line is kept whole or not at all: its rollouts are repeated when an
-- earlier line of the night had the Episode's id (CONTRACT.md 10.2, the part's `episode`).
-- The windows see only the narrow key columns: the rows are joined to their new number once.
-- A rollout's fields that grow with its calls are not here: the buckets read them.
CREATE OR REPLACE TEMP TABLE m_ranked AS
SELECT part, rollout_seq, rollout_id, capture, source_file, source_line, episode,
       row_number() OVER (PARTITION BY rollout_id ORDER BY part, rollout_seq) AS occurrence,
       CASE WHEN episode IS NULL THEN true
            ELSE (part, source_file, source_line) = first_value((part, source_file, source_line))
                 OVER (PARTITION BY episode ORDER BY part, rollout_seq) END AS first_episode
FROM p_rollouts;
CREATE OR REPLACE TEMP TABLE m_kept AS
SELECT part, rollout_seq, rollout_id, capture, row_number() OVER (ORDER BY part, rollout_seq) AS night_seq
FROM m_ranked WHERE occurrence = 1 AND first_episode;
INSERT INTO rollouts BY NAME
SELECT CAST($ds AS DATE) AS ds, p.* EXCLUDE (part, rollout_seq, episode), k.night_seq AS rollout_seq
FROM p_rollouts p JOIN m_kept k USING (part, rollout_seq);
-- A verifiers rollout's slot: its place among its group's verifiers rollouts in reading
-- order, masked ones included (CONTRACT.md 10.3).
UPDATE rollouts SET slot = v.slot
FROM (SELECT rollout_id, CAST(row_number() OVER (PARTITION BY group_id ORDER BY rollout_seq) - 1 AS INTEGER) AS slot
      FROM rollouts WHERE ds = CAST($ds AS DATE) AND capture = 'verifiers') v
WHERE rollouts.ds = CAST($ds AS DATE) AND rollouts.rollout_id = v.rollout_id;
CREATE OR REPLACE TEMP TABLE m_repeated AS
SELECT part, source_file, source_line, rollout_id, capture,
       CASE WHEN NOT first_episode THEN episode END AS episode
FROM m_ranked WHERE occurrence > 1 OR NOT first_episode;
DROP TABLE m_ranked;
