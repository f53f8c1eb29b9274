-- The load parts' ledger lines (`p_ledger`, capture IS NULL): each part numbered its lines
-- from 1 in its files' order; `part_bases` gives the lines of the parts before it, so
-- capture_seq is the line's number in the whole night's reading order.
INSERT INTO ledger BY NAME
SELECT CAST($ds AS DATE) AS ds, l.* EXCLUDE (part, capture_seq), l.capture_seq + b.base AS capture_seq
FROM p_ledger l JOIN part_bases b USING (part)
WHERE l.capture IS NULL;
