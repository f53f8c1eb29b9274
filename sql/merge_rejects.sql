-- The load parts' own reject rows (`p_rejects`, load/merge.py), as they are.
INSERT INTO rejects BY NAME SELECT CAST($ds AS DATE) AS ds, * EXCLUDE (part) FROM p_rejects;
