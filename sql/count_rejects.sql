-- Reject rows of one night (the load summary).
SELECT count(*) FROM rejects WHERE ds = $ds;
