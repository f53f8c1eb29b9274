-- The quality gate's verdict of one night (a rerun replaces it).
DELETE FROM quality WHERE ds = CAST($ds AS DATE);
INSERT INTO quality VALUES (CAST($ds AS DATE), $run_id, now()::TIMESTAMP, $verdict, $breaches);
